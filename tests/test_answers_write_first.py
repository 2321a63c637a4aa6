"""Who writes an answer (kafka_gateway/connection/answers.py): a connection's
only request in flight writes its own as its task ends (the end-to-end
latency's cut); with several in flight the done callbacks write them, in
request order, so a pipelining client's requests keep arriving, and being
group-committed, together (docs/performance.md, "Answers written by their own task")."""

from __future__ import annotations

import asyncio
import logging

from kafka_gateway.bad_input import BadInputLog
from kafka_gateway.connection.answers import Answer, Answers
from kafka_gateway.connection.state import ConnectionState
from kafka_gateway.metrics import Metrics


class RecordingTransport:
    """The part of a transport Answers writes through."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def writelines(self, chunks: list[bytes]) -> None:
        self.written.append(b"".join(chunks))


def answers_on(loop: asyncio.AbstractEventLoop) -> tuple[Answers, RecordingTransport]:
    metrics = Metrics()
    state = ConnectionState(loop, metrics, BadInputLog(logging.getLogger("test"), metrics))
    transport = RecordingTransport()
    state.transport = transport  # type: ignore[assignment]
    return Answers(state, None, lambda: None), transport  # type: ignore[arg-type]


def in_flight(answers: Answers, loop: asyncio.AbstractEventLoop) -> Answer:
    """A request being served (what Answers.add records, without its read buffer)."""
    request: Answer = loop.create_future()
    answers.pending.append((request, 0, None))
    request.add_done_callback(answers.flush)
    return request


def test_the_only_request_in_flight_writes_its_own_answer():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        answers, transport = answers_on(loop)
        only = in_flight(answers, loop)
        assert answers.write_first(only, [b"answer"])
        assert transport.written == [b"answer"]  # at once, not a pass later
        only.set_result(None)  # the task returns None: nothing to write twice
        await asyncio.sleep(0)
        assert transport.written == [b"answer"] and not answers.pending

    asyncio.run(main())


def test_pipelined_answers_are_written_by_the_done_callbacks_in_order():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        answers, transport = answers_on(loop)
        first, second = in_flight(answers, loop), in_flight(answers, loop)
        # Its turn has come, but another request is in flight behind it.
        assert not answers.write_first(first, [b"first"])
        assert not answers.write_first(second, [b"second"])
        assert transport.written == []
        second.set_result([b"second"])
        await asyncio.sleep(0)
        assert transport.written == []  # behind the first
        first.set_result([b"first"])
        await asyncio.sleep(0)
        assert transport.written == [b"first", b"second"] and not answers.pending

    asyncio.run(main())


def test_an_answer_behind_the_written_ones_writes_itself_once_alone():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        answers, transport = answers_on(loop)
        first, second = in_flight(answers, loop), in_flight(answers, loop)
        first.set_result([b"first"])
        await asyncio.sleep(0)
        assert transport.written == [b"first"]
        assert answers.write_first(second, [b"second"])  # alone in flight now
        assert transport.written == [b"first", b"second"]

    asyncio.run(main())
