"""Size-prefixed frames cut out of a connection's read buffer.

Frames are handed on as read-only views of the buffer: no copy. The socket
only ever writes past the buffer's end, never under a frame handed out. A size
prefix over ``socket.request.max.bytes`` closes the connection; before a SASL
client has authenticated, one over ``sasl.server.max.receive.size`` fails its
authentication: both are refused from the prefix alone, as Kafka does.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from ..request_memory import ReadBuffer
from .read_buffer import ConnectionBuffer
from .state import ConnectionState

_SIZE = struct.Struct(">i")


def take_frames(state: ConnectionState, buffer: ConnectionBuffer, max_frame_bytes: int,
                saturated: Callable[[], bool],
                dispatch: Callable[[memoryview, ReadBuffer], None]) -> None:
    """Hand each whole frame received to ``dispatch``, while not ``saturated()``;
    then leave room for the next read (unless saturated or waiting for memory)."""
    current = buffer.current
    if current is None or state.closing:
        return
    view = memoryview(current.data).toreadonly()
    end = buffer.end
    while end - buffer.start >= 4 and not state.closing and not saturated():
        pos = buffer.start
        (size,) = _SIZE.unpack_from(view, pos)
        gate = state.gate
        if gate is not None and not 0 <= size <= gate.max_receive_size:
            # Before authentication only small frames (sasl.server.max.receive.size).
            gate.oversized(size)
            return
        if size < 0 or size > max_frame_bytes:
            state.reject(f"frame of {size} bytes (limit {max_frame_bytes})")
            return
        if end - pos - 4 < size:
            break
        buffer.frame_taken(size)
        dispatch(view[pos + 4 : pos + 4 + size], current)
    if not (state.closing or saturated() or buffer.awaiting_memory):
        buffer.prepare_read()
