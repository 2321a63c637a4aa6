"""Each frame read becomes a request served by its API's handler (apis/).

A frame that cannot be read, or asks for an API or version this gateway does
not implement, closes this connection only (Kafka does the same, except that
ApiVersions is always answered: in v0, so the client can retry at a version
both sides know). A request read runs as its own task; a handler takes its
offsets before its first ``await`` and tasks start in creation order, so
produce requests on one connection append in the order sent.

``Dispatcher.serve`` is the one place where a handler's unexpected error is
caught (broadly) and counted.
"""

from __future__ import annotations

import asyncio
import time

from kio.schema.errors import ErrorCode

from ..apis import APIS, api_versions
from ..codec import (
    API_VERSIONS_KEY,
    MalformedRequest,
    Request,
    decode_request,
    encode_response,
    read_header,
)
from ..context import HandlerContext
from ..request_memory import ReadBuffer
from ..slicing import encode, encode_small
from .answers import Answers
from .regions import AnswerChunks
from .state import ConnectionState


class Dispatcher:
    def __init__(self, broker: HandlerContext, state: ConnectionState, answers: Answers,
                 connection_id: int) -> None:
        self.broker = broker
        self.state = state
        self.answers = answers
        self.connection_id = connection_id

    def dispatch(self, frame: memoryview, buffer: ReadBuffer) -> None:
        state = self.state
        if state.gate is not None and state.gate.intercept(frame):
            return
        try:
            header, body_pos = read_header(frame)
            api = APIS.get(header.api_key)
            if api is None or not api.min_version <= header.api_version <= api.max_version:
                if header.api_key == API_VERSIONS_KEY:
                    # Answer in v0 so the client can retry at a version we know.
                    response = api_versions.response(0, ErrorCode.unsupported_version)
                    self.answers.add_ready(encode_response(header.api_key,
                                                           header.correlation_id, response))
                    return
                name = api.name if api else f"unknown API key {header.api_key}"
                state.reject(f"{name} v{header.api_version} is not supported")
                return
            request = decode_request(frame, header, body_pos, api.decode, state.client_host,
                                     self.connection_id, state.session,
                                     self.broker.config.request_max_array_items)
        except MalformedRequest as exc:
            state.reject(str(exc))
            return
        task = state.loop.create_task(self.serve(request, api.name))
        self.answers.add(task, len(frame), buffer)

    async def serve(self, request: Request, name: str) -> AnswerChunks | None:
        metrics = self.broker.metrics
        answers = self.answers
        started = time.perf_counter()
        metrics.requests[name] += 1
        api = APIS[request.header.api_key]
        handle = api.handle
        try:
            if api.one_at_a_time:
                # Held until Answers.flush has written the answer: released when
                # the handler returns, the next one would find the socket still
                # writable and answer too, before the first answer is written.
                await answers.one_at_a_time.acquire()
                answers.one_at_a_time_holder = asyncio.current_task()
                await answers.writable.wait()
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
        header = request.header
        chunks = encode_small(metrics, name, header.api_key, header.correlation_id, body)
        if chunks is None:  # no coroutine for the common, small answer
            chunks = await encode(metrics, name, header.api_key, header.correlation_id, body)
        task = asyncio.current_task(self.state.loop)  # with its loop: no getpid()
        assert task is not None
        if answers.write_first(task, chunks):
            return None  # written: Answers.flush has only its request to let go of
        return chunks
