"""A connection's answers, written strictly in request order, as the protocol requires.

Each request runs as its own task (a long-polling Fetch does not hold up a
Produce behind it); its answer waits in ``pending`` until every earlier one
is written. A connection's only request in flight writes its answer from its
own task as it ends (``write_first``), a loop pass before its done callback
would; a pipelining connection's answers are written by the done callbacks. An answer is
handed to the socket as one ``writelines`` of about 64 KiB buffers
(codec.encode_response); a write the transport refuses (writev's EINVAL, say)
is logged, counted, and closes the connection.

An answer holding regions of the engine's files (a Fetch's record bytes) is
sent with ``os.sendfile`` on plaintext listeners (regions.py), which may wait
for the socket: the answers after it wait for it (``sending``), and so does
the release of a one-at-a-time API's lock, so the next Fetch starts only once
this one is written. On TLS listeners its regions are read and written as bytes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence

from ..request_memory import ReadBuffer
from .read_buffer import ConnectionBuffer
from .regions import (
    AnswerChunks,
    BytesRun,
    RegionSend,
    has_regions,
    read_regions,
    region_bytes,
)
from .state import ConnectionState, SocketLike

# Buffers written as they are (SASL's answers before authentication).
Chunks = Sequence[bytes | bytearray]
# An answer: the pieces of its frame, None for none (a Produce with acks=0).
Answer = asyncio.Future[AnswerChunks | None]

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
        # An answer with file regions still being sent (regions.py), and its request.
        self.sending: RegionSend | None = None
        self.sending_answer: Answer | None = None

    @property
    def full(self) -> bool:
        return (len(self.pending) >= self.state.max_in_flight
                or self.pending_bytes >= MAX_IN_FLIGHT_BYTES)

    def add(self, task: asyncio.Task[AnswerChunks | None], size: int,
            buffer: ReadBuffer) -> None:
        """A request being served, from a frame of ``size`` bytes read into ``buffer``."""
        self.pending_bytes += size
        buffer.frames += 1
        self.pending.append((task, size, buffer))
        task.add_done_callback(self.flush)

    def add_ready(self, chunks: AnswerChunks) -> None:
        """An answer ready at once, written in its turn."""
        future: Answer = self.state.loop.create_future()
        future.set_result(chunks)
        self.pending.append((future, 0, None))
        # Not flushed from here: this runs while frames are being taken.
        self.state.loop.call_soon(self.flush)

    def write_first(self, task: Answer, chunks: AnswerChunks) -> bool:
        """Write ``task``'s answer from the task itself, before it ends, when it is
        the connection's only request in flight: its done callback (``flush``)
        would write it a loop pass later, after whatever else that pass runs
        (docs/performance.md, "End-to-end median"). False when other requests are
        in flight, or the answer has file regions: the task returns it and
        ``flush`` writes it as before.

        Not for a pipelining connection, even when its turn has come: its first
        answer, sent a pass early, brings its client's next request alone, and
        the requests that arrived together, and shared one group commit, come to
        arrive one by one, a group write each (measured: 5 in flight, 1.2 instead
        of 5 requests a write, 25 % more CPU per request; docs/performance.md,
        "Answers written by their own task")."""
        pending = self.pending
        if (len(pending) != 1 or pending[0][0] is not task or self.sending is not None
                or has_regions(chunks)):
            return False
        state = self.state
        if state.transport is not None and not state.closing:
            self.write(chunks)  # a refused write closes the connection
        return True

    def flush(self, _task: object = None) -> None:
        """Write the answers that are done, in order, up to the first one that is not."""
        pending = self.pending
        while pending and pending[0][0].done() and self.sending is None:
            task, size, buffer = pending.popleft()
            self.pending_bytes -= size
            if buffer is not None:
                self.buffer.answered(buffer)
            failed = not task.cancelled() and not self._answer(task)
            if self.sending is not None:  # the rest when it is sent (_sent)
                self.sending_answer = task
                return
            self._release(task)
            if failed:
                return
        if self.sending is None:
            self.after_flush()

    def _release(self, task: Answer) -> None:
        if task is self.one_at_a_time_holder:
            self.one_at_a_time_holder = None
            self.one_at_a_time.release()

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

    def write(self, chunks: AnswerChunks) -> bool:
        """Hand an answer to the socket; False (logged, counted) if it refused it.

        A refused write (writev's EINVAL, say) closes the transport at once and
        silently: seen here, or the client would just see the connection close.
        An answer with file regions may still be being sent when this returns
        True (``sending``)."""
        state = self.state
        transport = state.transport
        assert transport is not None
        if transport.is_closing():  # the client went away first: nothing refused
            return True
        if has_regions(chunks) and state.sendfile_socket is not None:
            return self._send_regions(state.sendfile_socket, chunks)
        failure: BaseException | None = None
        try:
            # Regions on TLS: read, as their bytes pass through Python to be
            # encrypted anyway.
            transport.writelines(read_regions(chunks))
        except (OSError, RuntimeError, ValueError) as exc:
            failure = exc
        if failure is None and not transport.is_closing():
            state.metrics.bytes_out += sum(map(len, chunks))
            state.metrics.file_region_read_bytes += region_bytes(chunks)
            state.active()
            return True
        state.metrics.response_write_failures += 1
        state.bad_input.log(
            state.address, logging.ERROR, "closing %s: writing an answer of %d bytes in %d "
            "buffers failed: %s", state.peer, sum(map(len, chunks)), len(chunks),
            failure or "the transport closed", exc_info=failure)
        state.close()
        return False

    def _send_regions(self, sock: SocketLike, chunks: AnswerChunks) -> bool:
        send = RegionSend(self.state, sock, chunks, self._write_run, self._sent, self._waiting)
        result = send.run()
        if result is None:
            self.sending = send
            return True
        return result

    def _write_run(self, run: BytesRun) -> bool:
        return self.write(run)

    def _waiting(self, waiting: bool) -> None:
        """A file region waits for the socket (True), or no longer (False)."""
        state = self.state
        state.sendfile_waiting = waiting
        if waiting:
            self.writable.clear()
            self.after_flush()  # saturated now: reading pauses
        elif not state.writing_paused:
            self.writable.set()

    def _sent(self, ok: bool) -> None:
        """The answer being sent is written (or its connection is closing)."""
        task = self.sending_answer
        self.sending = self.sending_answer = None
        if task is not None:
            self._release(task)
        if ok:
            self.flush()

    def cancel(self) -> None:
        """The connection closed: no answer is written; the buffers are let go."""
        if self.sending is not None:
            self.sending.cancel()
            self.sending = self.sending_answer = None
        for task, _size, buffer in self.pending:
            task.cancel()
            if buffer is not None:
                self.buffer.memory.retire(buffer)
        self.pending.clear()

    async def drain(self, timeout: float) -> None:
        """Let the requests already read finish and be answered (shutdown),
        including an answer's file regions still being sent: closing the
        transport would cut them off (it only flushes what it holds itself)."""
        loop = self.state.loop
        deadline = loop.time() + timeout
        if self.pending:
            await asyncio.wait([task for task, _size, _buffer in self.pending], timeout=timeout)
        while (self.sending is not None or (self.pending and self.pending[0][0].done())) \
                and not self.state.closing and loop.time() < deadline:
            await asyncio.sleep(0.01)  # a slow client's send, at shutdown only
