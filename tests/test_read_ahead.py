"""A connection's reads (kafka_gateway/connection/read_buffer.py): a client that
pipelines small requests gets buffers that take many of its frames a read; a
client that sends one request at a time keeps small ones; either way every frame
is cut whole and in order, and every buffer's charge comes back once its frames
are answered (docs/performance.md, "Reads that take many frames").

The socket is simulated: each read copies into the room ``get`` offers as many
bytes as the client has sent and not yet been read.
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct

from kafka_gateway.bad_input import BadInputLog
from kafka_gateway.connection.framing import take_frames
from kafka_gateway.connection.read_buffer import MAX_READ_AHEAD_BYTES, ConnectionBuffer
from kafka_gateway.connection.state import ConnectionState
from kafka_gateway.metrics import Metrics
from kafka_gateway.request_memory import FIRST_READ_BYTES, ReadBuffer, RequestMemory

MAX_FRAME = 100 << 20


def frames_of(sizes: list[int], seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for size in sizes]


class Connection:
    """A ConnectionBuffer read from a simulated socket, its frames answered on demand."""

    def __init__(self, loop: asyncio.AbstractEventLoop, budget: int = 0) -> None:
        metrics = self.metrics = Metrics()
        self.state = ConnectionState(loop, metrics, BadInputLog(logging.getLogger("test"),
                                                                metrics))
        self.memory = RequestMemory(budget, metrics)  # 0: no node budget, only the charges
        self.buffer = ConnectionBuffer(self.state, self.memory, lambda: None)
        self.received: list[bytes] = []
        self.unanswered: list[ReadBuffer] = []
        self.reads = 0
        self.largest_buffer = 0
        self.largest_read_ahead = 0

    def _dispatch(self, frame: memoryview, read_buffer: ReadBuffer) -> None:
        self.received.append(bytes(frame))
        read_buffer.frames += 1  # what Answers.add counts
        self.unanswered.append(read_buffer)

    def read(self, socket_bytes: bytearray) -> None:
        """One read of what the socket holds, then the frames it completed."""
        room = self.buffer.get()
        current = self.buffer.current
        assert current is not None
        self.largest_buffer = max(self.largest_buffer, len(current.data))
        del current
        n = min(len(room), len(socket_bytes))
        room[:n] = socket_bytes[:n]
        del socket_bytes[:n]
        del room
        self.reads += 1
        self.buffer.received(n)
        self.largest_read_ahead = max(self.largest_read_ahead, self.buffer.read_ahead)
        take_frames(self.state, self.buffer, MAX_FRAME, lambda: False, self._dispatch)

    def read_all(self, socket_bytes: bytearray) -> None:
        """Read until the socket holds nothing more."""
        while socket_bytes:
            self.read(socket_bytes)

    def answer_all(self) -> None:
        for read_buffer in self.unanswered:
            self.buffer.answered(read_buffer)
        self.unanswered.clear()

    def close(self) -> None:
        """Answer every frame and close: every buffer's charge has come back."""
        self.answer_all()
        self.buffer.release()
        assert self.memory.used == 0


def wire(frames: list[bytes]) -> bytearray:
    return bytearray(b"".join(struct.pack(">i", len(f)) + f for f in frames))


def test_a_pipelining_client_is_read_many_frames_at_a_time() -> None:
    """200 frames of 15.6 KB sent at once (librdkafka's 100-partition row): before,
    one read a frame, each into a buffer sized for that frame alone."""

    async def main() -> None:
        connection = Connection(asyncio.get_running_loop())
        frames = frames_of([15_600] * 200, seed=1)
        connection.read_all(wire(frames))
        assert connection.received == frames
        assert connection.reads <= 200 // 8, connection.reads
        assert connection.largest_buffer <= MAX_READ_AHEAD_BYTES
        assert connection.largest_read_ahead == MAX_READ_AHEAD_BYTES
        connection.close()

    asyncio.run(main())


def test_a_client_sending_one_request_at_a_time_keeps_small_buffers() -> None:
    """Each read finds one frame and comes back short: no read-ahead grows."""

    async def main() -> None:
        connection = Connection(asyncio.get_running_loop())
        frames = frames_of([200, 3_000, 90, 12_000] * 25, seed=2)
        for frame in frames:
            connection.read_all(wire([frame]))
            connection.answer_all()
            assert connection.buffer.current is None  # nothing unread: no buffer held
        assert connection.received == frames
        assert connection.largest_read_ahead == FIRST_READ_BYTES
        assert connection.largest_buffer == FIRST_READ_BYTES
        assert connection.memory.used == 0

    asyncio.run(main())


def test_read_ahead_shrinks_when_the_client_stops_pipelining() -> None:
    async def main() -> None:
        connection = Connection(asyncio.get_running_loop())
        burst = frames_of([1_000] * 2_000, seed=3)
        connection.read_all(wire(burst))
        assert connection.largest_read_ahead == MAX_READ_AHEAD_BYTES
        connection.answer_all()
        for frame in frames_of([500] * 10, seed=4):  # one at a time again
            connection.read(wire([frame]))
            connection.answer_all()
        assert connection.buffer.read_ahead == FIRST_READ_BYTES
        assert connection.received[: len(burst)] == burst
        assert len(connection.received) == len(burst) + 10

    asyncio.run(main())


def test_read_ahead_takes_no_memory_another_connection_needs() -> None:
    """With 96 KiB of request memory, a 256 KiB read-ahead does not fit: the
    pipelining connection reads into buffers sized for its frames, as without
    read-ahead, and leaves the overdraft slot free. So a second connection
    receiving a frame larger than the whole budget (what the slot is for) is
    served while the first one's frames are still unanswered."""

    async def main() -> None:
        budget = 96 << 10
        loop = asyncio.get_running_loop()
        pipelining = Connection(loop, budget)
        large = Connection(loop)
        large.memory = pipelining.memory  # one node: one budget
        large.buffer = ConnectionBuffer(large.state, large.memory, lambda: None)
        small_frames = frames_of([15_600] * 40, seed=7)
        socket_bytes = wire(small_frames)
        for _ in range(3):  # reads that fill their buffers, none of it answered
            pipelining.read(socket_bytes)
            assert not pipelining.buffer.awaiting_memory
        assert pipelining.largest_read_ahead > 15_604  # read-ahead was asked for
        big = frames_of([200 << 10], seed=8)
        big_bytes = wire(big)
        while big_bytes:
            large.read(big_bytes)
            assert not large.buffer.awaiting_memory, "the overdraft slot was taken"
        assert large.received == big
        assert pipelining.largest_buffer < MAX_READ_AHEAD_BYTES  # never granted
        pipelining.answer_all()
        while socket_bytes:
            pipelining.read(socket_bytes)
            pipelining.answer_all()
        assert pipelining.received == small_frames

    asyncio.run(main())


def test_frames_of_every_size_are_cut_whole_across_buffers() -> None:
    """Random sizes, from empty to larger than the read-ahead, sent in random chunks:
    a frame may start in one buffer and end several reads later."""

    async def main() -> None:
        rng = random.Random(5)
        connection = Connection(asyncio.get_running_loop())
        sizes = [rng.choice([0, 1, 3, 4, 5, 100, 4_095, 16_384, 70_000, 300_000, 1 << 20])
                 for _ in range(300)]
        frames = frames_of(sizes, seed=6)
        pending = wire(frames)
        socket_bytes = bytearray()
        while pending or socket_bytes:
            take = rng.randint(1, 400_000)  # what the client's next send put in the socket
            socket_bytes += pending[:take]
            del pending[:take]
            connection.read(socket_bytes)
            if rng.random() < 0.3:
                connection.answer_all()
        assert connection.received == frames
        assert connection.largest_read_ahead == MAX_READ_AHEAD_BYTES  # buffers grew
        connection.close()

    asyncio.run(main())
