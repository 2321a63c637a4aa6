"""A connection's answers, written strictly in request order, as the protocol requires.

Each request runs as its own task (a long-polling Fetch does not hold up a
Produce behind it); its answer waits in ``pending`` until every earlier one
is written. An answer is handed to the socket as one ``writelines`` of about
64 KiB buffers (codec.encode_response); a write the transport refuses
(writev's EINVAL, say) is logged, counted, and closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence

from ..request_memory import ReadBuffer
from .read_buffer import ConnectionBuffer
from .state import ConnectionState

# An answer: the buffers of its frame, None for none (a Produce with acks=0).
Chunks = Sequence[bytes | bytearray]
Answer = asyncio.Future[Chunks | None]

MAX_IN_FLIGHT_BYTES = 32 << 20


class Answers:
    def __init__(self, state: ConnectionState, buffer: ConnectionBuffer,
                 after_flush: Callable[[], None]) -> None:
        self.state = state
        self.buffer = buffer
        self.after_flush = after_flush  # more frames may be taken
        # Requests being served, in arrival order, with their frame sizes and
        # the buffers their frames are views of.
        self.pending: deque[tuple[Answer, int, ReadBuffer | None]] = deque()
        self.pending_bytes = 0
        self.writable = asyncio.Event()
        self.writable.set()
        # APIs served one at a time (Api.one_at_a_time): the task holding the lock.
        self.one_at_a_time = asyncio.Lock()
        self.one_at_a_time_holder: Answer | None = None

    @property
    def full(self) -> bool:
        return (len(self.pending) >= self.state.max_in_flight
                or self.pending_bytes >= MAX_IN_FLIGHT_BYTES)

    def add(self, task: asyncio.Task[Chunks | None], size: int, buffer: ReadBuffer) -> None:
        """A request being served, from a frame of ``size`` bytes read into ``buffer``."""
        self.pending_bytes += size
        buffer.frames += 1
        self.pending.append((task, size, buffer))
        task.add_done_callback(self.flush)

    def add_ready(self, chunks: Chunks) -> None:
        """An answer ready at once, written in its turn."""
        future: Answer = self.state.loop.create_future()
        future.set_result(chunks)
        self.pending.append((future, 0, None))
        # Not flushed from here: this runs while frames are being taken.
        self.state.loop.call_soon(self.flush)

    def flush(self, _task: object = None) -> None:
        """Write the answers that are done, in order, up to the first one that is not."""
        pending = self.pending
        while pending and pending[0][0].done():
            task, size, buffer = pending.popleft()
            self.pending_bytes -= size
            if buffer is not None:
                self.buffer.answered(buffer)
            failed = not task.cancelled() and not self._answer(task)
            if task is self.one_at_a_time_holder:
                self.one_at_a_time_holder = None
                self.one_at_a_time.release()
            if failed:
                return
        self.after_flush()

    def _answer(self, task: Answer) -> bool:
        """Write a finished request's answer; False if it failed (the connection closes)."""
        state = self.state
        error = task.exception()
        if error is not None:
            state.bad_input.log(state.address, logging.ERROR,
                                "closing %s: request failed", state.peer, exc_info=error)
            state.close()
            return False
        chunks = task.result()
        if chunks and state.transport is not None and not state.closing:
            return self.write(chunks)
        return True

    def write(self, chunks: Chunks) -> bool:
        """Hand an answer to the socket; False (logged, counted) if it refused it.

        A refused write (writev's EINVAL, say) closes the transport at once and
        silently: seen here, or the client would just see the connection close."""
        state = self.state
        transport = state.transport
        assert transport is not None
        if transport.is_closing():  # the client went away first: nothing refused
            return True
        try:
            transport.writelines(chunks)
            failure: BaseException | None = None
        except (OSError, RuntimeError, ValueError) as exc:
            failure = exc
        if failure is None and not transport.is_closing():
            state.metrics.bytes_out += sum(map(len, chunks))
            state.active()
            return True
        state.metrics.response_write_failures += 1
        state.bad_input.log(
            state.address, logging.ERROR, "closing %s: writing an answer of %d bytes in %d "
            "buffers failed: %s", state.peer, sum(map(len, chunks)), len(chunks),
            failure or "the transport closed", exc_info=failure)
        state.close()
        return False

    def cancel(self) -> None:
        """The connection closed: no answer is written; the buffers are let go."""
        for task, _size, buffer in self.pending:
            task.cancel()
            if buffer is not None:
                self.buffer.memory.retire(buffer)
        self.pending.clear()

    async def drain(self, timeout: float) -> None:
        """Let the requests already read finish and be answered (shutdown)."""
        if self.pending:
            await asyncio.wait([task for task, _size, _buffer in self.pending], timeout=timeout)
