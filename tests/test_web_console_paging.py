"""The console's lists are paged, and a page costs the same at 30,000 ids as at 50.

In-process: 30,000 transactional ids made over the wire (pipelined
InitProducerId), 120 topics, 120 groups. Each list page is rendered by its
handler directly, so the time it takes is the time it holds the event loop
(the handlers never await), and its size is what a browser downloads. Paging
forwards through every page and back shows every id once, in order.

The transactional id length cap (gateway.transactional.id.max.bytes) and
Kafka's 32767-byte string bound are tested here too: they bound what each id
costs, as paging bounds what listing them costs.
"""

from __future__ import annotations

import asyncio
import html
import re
import statistics
import struct
import time
from urllib.parse import quote

from aiohttp.test_utils import make_mocked_request
from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from kafka_gateway.prometheus import render
from kafka_gateway.webui.pages import Console
from kafka_gateway.webui.paging import PAGE_SIZE
from testkit import kafka_requests as kr
from testkit.inprocess import running
from testkit.kafka_requests import init_producer_id_frame, init_transactional_ids

IDS = 30_000
# Generous bounds on a 2-core machine shared with other work: a page measured
# about 1 ms of CPU and 9 KB; unpaged, these ids made a 4.3 MB page of 0.5-0.6 s.
# CPU time (of this process) rather than wall time: what other processes take
# of the machine meanwhile is not the page's doing; a garbage collection is.
MAX_PAGE_CPU_SECONDS = 0.1
MEDIAN_PAGE_CPU_SECONDS = 0.01
MAX_PAGE_BYTES = 64 << 10
_NEXT = re.compile(r'href="([^"]*)" rel="next"')
_PREV = re.compile(r'href="([^"]*)" rel="prev"')
_ROW_ID = re.compile(r"<tr><td>([^<]*)</td>")


CPU: list[float] = []  # each page's CPU time, in order
WALL: list[float] = []


async def _load(handler, path: str) -> tuple[str, float]:
    """The page at ``path`` and the CPU time its handler took (it never awaits: all
    of it is time the event loop is held)."""
    request = make_mocked_request("GET", path)
    started, cpu = time.perf_counter(), time.process_time()
    response = await handler(request)
    CPU.append(time.process_time() - cpu)
    WALL.append(time.perf_counter() - started)
    assert response.status == 200
    return response.text, CPU[-1]


def _cursor(pattern: re.Pattern[str], body: str) -> str | None:
    found = pattern.search(body)
    return None if found is None else found.group(1).replace("&amp;", "&")


def _ids(body: str) -> list[str]:
    table = body[body.index('id="transactions"'):]
    return [html.unescape(m) for m in _ROW_ID.findall(table[:table.index("</table>")])]


def test_thirty_thousand_transactional_ids_page_in_bounded_time_and_size(tmp_path):
    async def main() -> None:
        async with running(tmp_path) as server:
            host, port = server.config.listen
            ids = [f"tx-{i:05d}" for i in range(IDS)]
            started = time.perf_counter()
            codes = await init_transactional_ids(host, port, ids)
            made = time.perf_counter() - started
            assert set(codes) == {0}
            assert len(server.broker.txns.txns) == IDS  # the premise: they are all there
            assert f"kafka_gateway_transactional_ids {IDS}.0" in render(server.broker).decode()

            console = Console(server.broker)
            timings: dict[str, float] = {}
            sizes: dict[str, int] = {}
            first, timings["first"] = await _load(console.transactions, "/ui/transactions")
            sizes["first"] = len(first.encode())
            assert _ids(first) == ids[:PAGE_SIZE]
            assert _PREV.search(first) is None and "First</a>" not in first
            assert f"{PAGE_SIZE} of {IDS} transactional ids" in first

            # Forward through every page: every id once, in order, each page bounded.
            seen, body, pages = list(_ids(first)), first, 1
            slowest, largest = timings["first"], sizes["first"]
            while (next_path := _cursor(_NEXT, body)) is not None:
                body, elapsed = await _load(console.transactions, next_path)
                pages += 1
                slowest, largest = max(slowest, elapsed), max(largest, len(body.encode()))
                shown = _ids(body)
                assert 0 < len(shown) <= PAGE_SIZE
                seen.extend(shown)
            assert seen == ids and pages == IDS // PAGE_SIZE
            assert _PREV.search(body) is not None  # the last page links back

            # Back from the last page, page by page, to the first one.
            back = []
            while (prev_path := _cursor(_PREV, body)) is not None and len(back) < 5:
                body, elapsed = await _load(console.transactions, prev_path)
                back.append(_ids(body))
            assert back == [ids[IDS - PAGE_SIZE * (n + 2):IDS - PAGE_SIZE * (n + 1)]
                            for n in range(5)]
            middle, timings["middle"] = await _load(
                console.transactions, f"/ui/transactions?after={quote(ids[IDS // 2])}")
            assert _ids(middle) == ids[IDS // 2 + 1:IDS // 2 + 1 + PAGE_SIZE]
            start, _ = await _load(console.transactions,
                                   f"/ui/transactions?before={quote(ids[PAGE_SIZE])}")
            assert _ids(start) == ids[:PAGE_SIZE] and _PREV.search(start) is None
            overview, timings["overview"] = await _load(console.overview, "/ui/")
            assert f"<dd>{IDS}</dd>" in overview

            cpu_median = statistics.median(CPU)
            print(f"\n{IDS} transactional ids made in {made:.1f} s; {len(CPU)} page loads "
                  f"({pages} pages of {PAGE_SIZE} forwards): CPU median "
                  f"{cpu_median * 1000:.2f} ms, max {max(CPU) * 1000:.1f} ms; wall median "
                  f"{statistics.median(WALL) * 1000:.2f} ms, max {max(WALL) * 1000:.1f} ms; "
                  f"largest page {largest} B; first page {sizes['first']} B "
                  f"({timings['first'] * 1000:.2f} ms CPU), a middle one "
                  f"{timings['middle'] * 1000:.2f} ms, overview "
                  f"{timings['overview'] * 1000:.2f} ms")
            assert largest < MAX_PAGE_BYTES, f"a page of {largest} bytes"
            assert slowest <= max(CPU) < MAX_PAGE_CPU_SECONDS, (
                f"a page held the event loop for {max(CPU) * 1000:.0f} ms of CPU")
            assert cpu_median < MEDIAN_PAGE_CPU_SECONDS, (
                f"pages took {cpu_median * 1000:.1f} ms of CPU (median)")

    asyncio.run(main())


def test_topics_and_groups_are_paged(tmp_path):
    async def main() -> None:
        async with running(tmp_path) as server:
            client = await KafkaClient.connect(*server.config.listen)
            try:
                topics = [f"topic-{i:03d}" for i in range(120)]
                answer = await client.request(kr.create_topics([(t, 1) for t in topics]))
                assert {t.error_code for t in answer.topics} == {ErrorCode.none}
                # Names to escape and quote, one the cursor between pages 1 and 2.
                groups = sorted([f"group-{i:03d}" for i in range(120)]
                                + ["group-038 &<x>/ y?", "group-077%2F#"])
                for group in groups:
                    answer = await client.request(
                        kr.offset_commit(group, -1, "", "topic-000", [(0, 0)]))
                    assert answer.topics[0].partitions[0].error_code == ErrorCode.none
            finally:
                await client.close()
            console = Console(server.broker)
            assert groups[39] == "group-038 &<x>/ y?"
            for handler, path, names, table in (
                    (console.topics, "/ui/topics", topics, "topics"),
                    (console.groups, "/ui/groups", groups, "groups")):

                def rows(body: str, table: str = table) -> list[str]:
                    shown = body[body.index(f'id="{table}"'):]
                    shown = shown[:shown.index("</table>")]
                    return [html.unescape(name) for name in
                            re.findall(r'<tr><td><a href="[^"]*">([^<]*)</a>', shown)]

                forwards: list[list[str]] = []
                body, _ = await _load(handler, path + "?size=40")
                while True:
                    forwards.append(rows(body))
                    next_path = _cursor(_NEXT, body)
                    if next_path is None:
                        break
                    assert "size=40" in next_path
                    body, _ = await _load(handler, next_path)
                assert [name for page in forwards for name in page] == names, table
                assert f"{len(forwards[-1])} of {len(names)} {table}" in body
                backwards = [rows(body)]
                while (prev_path := _cursor(_PREV, body)) is not None:
                    body, _ = await _load(handler, prev_path)
                    backwards.insert(0, rows(body))
                assert backwards == forwards, table

    asyncio.run(main())


def test_transactional_id_length_is_bounded(tmp_path):
    """Up to gateway.transactional.id.max.bytes: accepted; longer: INVALID_REQUEST
    and nothing kept; a compact string over 32767 bytes closes the connection, as
    Kafka's parser refuses it."""
    async def main() -> None:
        async with running(tmp_path, transactional_id_max_bytes=1000) as server:
            host, port = server.config.listen
            reader, writer = await asyncio.open_connection(host, port)
            try:
                codes = []
                for correlation, tid in enumerate((b"a" * 1000, b"b" * 1001,
                                                   "é".encode() * 501, b"c" * 32767)):
                    writer.write(init_producer_id_frame(tid, correlation))
                    (size,) = struct.unpack(">i", await reader.readexactly(4))
                    frame = await reader.readexactly(size)
                    codes.append(struct.unpack_from(">iih", frame)[2])
                assert codes == [0, ErrorCode.invalid_request.value,
                                 ErrorCode.invalid_request.value,
                                 ErrorCode.invalid_request.value]
            finally:
                writer.close()
            assert list(server.broker.txns.txns) == ["a" * 1000]

            # v4 (flexible): the id's length is an unsigned varint, which can say
            # more than a Kafka string may hold.
            tid = b"d" * 40_000
            body = struct.pack(">hhih", 22, 4, 7, 4) + b"test" + b"\x00"
            length, varint = len(tid) + 1, b""
            while length >= 0x80:
                varint += bytes([length & 0x7F | 0x80])
                length >>= 7
            varint += bytes([length])
            body += varint + tid + struct.pack(">iqh", 60_000, -1, -1) + b"\x00"
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(struct.pack(">i", len(body)) + body)
                assert await asyncio.wait_for(reader.read(1), 30) == b""  # closed
            finally:
                writer.close()
            assert server.broker.metrics.bad_frames == 1
            assert len(server.broker.txns.txns) == 1

    asyncio.run(main())
