"""One client connection: framing, dispatch and in-order responses.

Requests are read as they arrive (clients pipeline) and each runs as its own
task, so a long-polling Fetch does not hold up a Produce behind it; answers
are written strictly in request order, as the protocol requires. A handler
takes its offsets before its first ``await`` and tasks start in creation
order, so produce requests on one connection append in the order sent.

Backpressure, so that a slow or stalled client only ever stalls itself: at
most ``MAX_IN_FLIGHT`` requests and ``MAX_IN_FLIGHT_BYTES`` of request frames
per connection (a producer pipelining large batches keeps the writer busy
without holding hundreds of MiB of frames); no new request is taken while
the socket's send buffer is full; and one Fetch at a time per connection, each
started only while the client is reading its answers, so what waits in memory
for a client that stopped reading is at most one Fetch answer (as with
Kafka, which serves one request per connection at a time).

A malformed or oversized frame, or a request for an API or version this
gateway does not implement, closes this connection only (Kafka does the same,
except that ApiVersions is always answered), and is logged.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import deque

from kio.schema.errors import ErrorCode

from .apis import APIS, api_versions
from .broker import Broker
from .codec import (
    API_VERSIONS_KEY,
    MalformedRequest,
    Request,
    decode_request,
    encode_response,
    read_header,
)

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
MAX_IN_FLIGHT_BYTES = 32 << 20
READ_BUFFER_BYTES = 256 << 10
MIN_READ_BYTES = 64 << 10
_SIZE = struct.Struct(">i")


class KafkaConnection(asyncio.BufferedProtocol):
    def __init__(self, broker: Broker, connections: set[KafkaConnection]) -> None:
        self.broker = broker
        self.connections = connections
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.client_host = ""
        self.id = broker.new_connection_id()
        # The socket reads straight into _buffer (BufferedProtocol): bytes in
        # [_start, _end) are received but not yet a whole frame.
        self._buffer = bytearray()
        self._start = 0
        self._end = 0
        # Requests being served, in arrival order, with their frame sizes.
        self._pending: deque[tuple[asyncio.Future[list[bytes] | None], int]] = deque()
        self._pending_bytes = 0
        self._reading_paused = False
        self._writing_paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._one_at_a_time = asyncio.Lock()
        self._closing = False

    # ------------------------------------------------------------ transport
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.client_host = f"/{peer[0]}" if peer else ""
        self.connections.add(self)
        self.broker.metrics.connections += 1
        self.broker.metrics.connections_total += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        self.broker.metrics.connections -= 1
        self._closing = True
        for task, _size in self._pending:
            task.cancel()
        self._pending.clear()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._writable.clear()
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._writable.set()
        self._take_frames()

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self._buffer) - self._end < MIN_READ_BYTES:
            self._new_buffer(MIN_READ_BYTES)
        return memoryview(self._buffer)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.broker.metrics.bytes_in += nbytes
        self._end += nbytes
        self._take_frames()

    def _take_frames(self) -> None:
        """Dispatch the whole frames received, as long as backpressure allows."""
        # Frames are handed on as read-only views of the buffer: no copy. The
        # socket only ever writes past _end, never under a frame handed out.
        view = memoryview(self._buffer).toreadonly()
        pos, end = self._start, self._end
        limit = self.broker.config.max_frame_bytes
        while end - pos >= 4 and not self._closing and not self._saturated:
            (size,) = _SIZE.unpack_from(view, pos)
            if size < 0 or size > limit:
                self._reject(f"frame of {size} bytes (limit {limit})")
                return
            if end - pos - 4 < size:
                if pos + 4 + size > len(self._buffer):
                    self._start = pos
                    self._new_buffer(4 + size)  # the whole frame will fit in one buffer
                    return
                break
            self._start = pos + 4 + size
            self._dispatch(view[pos + 4 : pos + 4 + size])
            pos = self._start
        self._start = pos
        self._update_reading()

    @property
    def _saturated(self) -> bool:
        return (
            self._writing_paused
            or len(self._pending) >= MAX_IN_FLIGHT
            or self._pending_bytes >= MAX_IN_FLIGHT_BYTES
        )

    def _new_buffer(self, room: int) -> None:
        """Move the unread bytes to a fresh buffer with ``room`` bytes free after them.

        The old buffer is left as it is: frames handed out may still view it.
        """
        unread = self._end - self._start
        buffer = bytearray(max(READ_BUFFER_BYTES, unread + room))
        buffer[:unread] = self._buffer[self._start : self._end]
        self._buffer, self._start, self._end = buffer, 0, unread

    # ------------------------------------------------------------- requests
    def _dispatch(self, frame: memoryview) -> None:
        try:
            header, body_pos = read_header(frame)
            api = APIS.get(header.api_key)
            if api is None or not api.min_version <= header.api_version <= api.max_version:
                if header.api_key == API_VERSIONS_KEY:
                    # Answer in v0 so the client can retry at a version we know.
                    response = api_versions.response(0, ErrorCode.unsupported_version)
                    self._queue_ready(encode_response(header.api_key, header.correlation_id,
                                                      response))
                    return
                name = api.name if api else f"unknown API key {header.api_key}"
                self._reject(f"{name} v{header.api_version} is not supported")
                return
            request = decode_request(frame, header, body_pos, api.decode, self.client_host,
                                     self.id)
        except MalformedRequest as exc:
            self._reject(str(exc))
            return
        task = asyncio.get_running_loop().create_task(self._serve(request, api.name))
        self._pending_bytes += len(frame)
        self._pending.append((task, len(frame)))
        task.add_done_callback(self._flush)

    async def _serve(self, request: Request, name: str) -> list[bytes] | None:
        metrics = self.broker.metrics
        started = time.perf_counter()
        metrics.requests[name] += 1
        api = APIS[request.header.api_key]
        handle = api.handle
        try:
            if api.one_at_a_time:
                async with self._one_at_a_time:
                    await self._writable.wait()
                    body = await handle(self.broker, request)
            else:
                body = await handle(self.broker, request)
        except Exception:
            metrics.request_errors[name] += 1
            raise
        finally:
            metrics.latency[name].observe(time.perf_counter() - started)
        if body is None:
            return None
        return encode_response(request.header.api_key, request.header.correlation_id, body)

    def _queue_ready(self, chunks: list[bytes]) -> None:
        future: asyncio.Future[list[bytes] | None] = asyncio.get_running_loop().create_future()
        future.set_result(chunks)
        self._pending.append((future, 0))
        # Not flushed from here: this runs inside _take_frames' loop.
        asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self, _task: object = None) -> None:
        pending = self._pending
        while pending and pending[0][0].done():
            task, size = pending.popleft()
            self._pending_bytes -= size
            if task.cancelled():
                continue
            error = task.exception()
            if error is not None:
                log.error("closing %s: request failed", self.peer, exc_info=error)
                self._close()
                return
            chunks = task.result()
            if chunks and self.transport is not None and not self._closing:
                self.transport.writelines(chunks)
                self.broker.metrics.bytes_out += sum(map(len, chunks))
        self._take_frames()

    def _update_reading(self) -> None:
        if self.transport is None or self._closing:
            return
        should_pause = self._saturated
        if should_pause and not self._reading_paused:
            self.transport.pause_reading()
            self._reading_paused = True
        elif not should_pause and self._reading_paused:
            self.transport.resume_reading()
            self._reading_paused = False

    def _reject(self, reason: str) -> None:
        log.warning("closing connection from %s: %s", self.peer, reason)
        self.broker.metrics.bad_frames += 1
        self._close()

    def _close(self) -> None:
        self._closing = True
        if self.transport is not None:
            self.transport.close()

    async def drain(self, timeout: float) -> None:
        """Let the requests already read finish and be answered (shutdown)."""
        if self._pending:
            await asyncio.wait([task for task, _size in self._pending], timeout=timeout)
        self._close()
