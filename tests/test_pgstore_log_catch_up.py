"""A partition's leader learns of commits another gateway published into it
(pgstore.log_notices wired by pgstore.cluster, ``PgPartitionLog.noticed``):
two gateways' engines in one process on a throwaway PostgreSQL.

- A commit through the gateway that does not lead the partition takes its
  offsets from the row (its own view of the partition is stale), and the
  leader's log end and high watermark move at once, its long-poll wakes.
- The leader's appends racing with such commits: an append the fence
  refuses because a commit moved the row's log end takes new offsets after
  the reread (failing, retriably, only once overtaken ``MAX_REASSIGN``
  times in a row), no offset is given twice, and the leader ends at the
  row's log end.
- Batches carry the partition's leader epoch in a cluster, 0 without one.
- The leader's own commit, its offsets reserved, overtaken by another
  gateway's: it lands after it, not refused.
"""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from collections.abc import Awaitable, Callable

from pgstore.appends import MAX_REASSIGN
from pgstore.cluster import ClusterSettings
from pgstore.membership import Listener
from pgstore.node import PgNodeSettings, PgNodeStorage
from tablets import batch as batch_header
from tablets.control import commit_marker
from tablets.errors import StorageError
from testkit import postgres
from testkit.batches import make_batch
from testkit.pg_engines import until
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
TIMEOUT = 60
LEASE = 1.5


def epoch_of(batch: bytes) -> int:
    """A stored batch's partition leader epoch."""
    epoch: int = struct.unpack_from(">i", batch, 12)[0]
    return epoch


def now() -> int:
    return int(time.time() * 1000)


async def gateway(pg: PostgresServer, schema: str, node_id: int) -> PgNodeStorage:
    node = PgNodeStorage(pg.dsn, PgNodeSettings(
        schema=schema, cluster=ClusterSettings(node_id=node_id, lease_seconds=LEASE)))
    await node.start()
    await node.join_cluster([Listener("PLAINTEXT", f"gw{node_id}", 9000 + node_id)])
    return node


def run(body: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(body(), TIMEOUT)

    asyncio.run(bounded())


async def two_gateways(pg: PostgresServer) -> tuple[PgNodeStorage, PgNodeStorage, int]:
    """(a, b, the index of a partition of topic "t" that b leads)."""
    schema = f"catchup_{uuid.uuid4().hex[:10]}"
    a = await gateway(pg, schema, 1)
    b = await gateway(pg, schema, 2)
    ca, cb = a.cluster(), b.cluster()
    assert ca is not None and cb is not None
    await a.create_topic("t", 2, {})
    await until(lambda: b.find_topic("t") is not None
                and sum(cb.leads("t", i) for i in range(2)) == 1
                and sum(ca.leads("t", i) for i in range(2)) == 1, "one partition each",
                3 * LEASE)
    return a, b, next(i for i in range(2) if cb.leads("t", i))


async def commit_marker_through(a: PgNodeStorage, index: int) -> None:
    """A commit through ``a`` of a transaction holding partition ``index``
    (written nowhere): its COMMIT marker is published there."""
    storage = a.transaction_storage()
    change = storage.begin()
    publish = storage.stage_commit(change, a.partition("t", index), [],
                                   commit_marker(7, 0, now()))
    await storage.commit(change)
    publish()


def test_a_commit_through_another_gateway_moves_the_leader_at_once(
        pg_server: PostgresServer) -> None:
    async def body() -> None:
        a, b, index = await two_gateways(pg_server)
        try:
            led = b.partition("t", index)
            assert (await led.append(make_batch([b"x", b"y"]), now())).base_offset == 0
            stale = a.partition("t", index)
            assert stale.fenced and stale.log_end_offset == 0  # a's view: stale
            waiting = led.waiter()
            await commit_marker_through(a, index)
            took = await until(lambda: led.high_watermark == 3, "moved by the notice", 3)
            assert waiting.done()  # the long-poll woke
            assert (led.log_end_offset, led.notices_applied) == (3, 1)
            assert led.tail.first_offset(default=-1) == -1  # restarted at the new end
            read = await led.read(0, 1 << 20)
            assert [batch_header.base_offset_of(x) for x in read.batches] == [0, 2]
            # Batches carry the partition's leader epoch, as Metadata answers
            # it: the append the leader's, the marker the epoch a knew.
            assert [epoch_of(x) for x in read.batches] == [led.leader_epoch, stale.leader_epoch]
            assert 0 < stale.leader_epoch <= led.leader_epoch
            # The next append goes after the commit: nothing refused, nothing reused.
            assert (await led.append(make_batch([b"z"]), now())).base_offset == 3
            assert stale.noticed_end == 3  # a, not leading, only noted it
            print(f"\nleader moved {took * 1000:.1f} ms after the commit returned")
        finally:
            await a.close()
            await b.close()

    run(body)


def test_the_engine_without_a_cluster_stamps_epoch_0(pg_server: PostgresServer) -> None:
    """The engine without cluster settings (the library alone: the server
    always runs it in a cluster, of one gateway or more) answers epoch 0,
    as the embedded engine does, so its batches carry 0 whatever the
    partition row's fencing epoch."""
    async def body() -> None:
        node = PgNodeStorage(pg_server.dsn, PgNodeSettings(
            schema=f"alone_{uuid.uuid4().hex[:10]}"))
        await node.start()
        try:
            await node.create_topic("t", 1, {})
            log = node.partition("t", 0)
            assert log.leader_epoch > 0  # claimed at start: the row's epoch moved
            await log.append(make_batch([b"x"]), now())
            read = await log.read(0, 1 << 20)
            assert [epoch_of(x) for x in read.batches] == [0]
        finally:
            await node.close()

    run(body)


def test_appends_racing_with_commits_from_another_gateway_never_share_an_offset(
        pg_server: PostgresServer) -> None:
    async def body() -> None:
        a, b, index = await two_gateways(pg_server)
        try:
            led = b.partition("t", index)
            landed: list[tuple[int, int]] = []  # (base, records)
            refused = 0

            async def append_all() -> None:
                nonlocal refused
                for round_ in range(40):
                    futures = [led.append(make_batch([b"%d-%d" % (round_, i)] * 2), now())
                               for i in range(5)]
                    for outcome in await asyncio.gather(*futures, return_exceptions=True):
                        if isinstance(outcome, StorageError):
                            refused += 1  # retriable: not written
                        elif isinstance(outcome, BaseException):
                            raise outcome
                        else:
                            landed.append((outcome.base_offset, 2))

            async def commit_all() -> None:
                for _ in range(40):
                    await commit_marker_through(a, index)
                    await asyncio.sleep(0.001)

            await asyncio.gather(append_all(), commit_all())
            # The race happened (appends the fence refused because a commit
            # moved the row), and such an append took new offsets instead of
            # failing: one fails (retriably) only once overtaken MAX_REASSIGN
            # times in a row.
            assert led.appends.reassigned > 0
            assert refused * MAX_REASSIGN <= led.appends.reassigned, (
                refused, led.appends.reassigned)
            assert len(landed) + refused == 200 and len(landed) > 100
            end = 2 * len(landed) + 40
            await until(lambda: led.high_watermark == end, "every offset known", 5)
            assert led.log_end_offset == end
            read = await led.read(0, 1 << 30)
            spans = [(batch_header.base_offset_of(x), batch_header.record_count_of(x))
                     for x in read.batches]
            covered = 0
            for base, count in spans:  # each offset once, from 0 to the end
                assert base == covered, spans
                covered = base + count
            assert covered == end
            assert set(landed) <= set(spans)  # each acknowledged append where it was told
            print(f"\n{len(landed)} appends landed, {refused} failed among 40 commits from "
                  f"the other gateway; {led.appends.reassigned} assignments again after the "
                  "fence refused one; "
                  f"notices applied at once: {led.notices_applied}")
        finally:
            await a.close()
            await b.close()

    run(body)


def test_the_leaders_own_commit_overtaken_by_another_gateways_lands_after_it(
        pg_server: PostgresServer) -> None:
    """The leader reserved offsets for its own commit; another gateway's
    commit took them first: the leader's commit is not refused, it lands
    after (PostgreSQL's offsets), and the leader rereads its row."""
    async def body() -> None:
        a, b, index = await two_gateways(pg_server)
        try:
            led = b.partition("t", index)
            storage = b.transaction_storage()
            change = storage.begin()
            publish = storage.stage_commit(change, led, [], commit_marker(8, 0, now()))
            assert led.log_end_offset == 1  # reserved [0, 1) here
            await commit_marker_through(a, index)  # lands first, at 0
            await storage.commit(change)
            publish()
            await until(lambda: led.high_watermark == 2 and not led.appends.in_doubt,
                        "the leader at the row's end", 5)
            read = await led.read(0, 1 << 20)
            assert [(batch_header.base_offset_of(x), batch_header.transactional_producer(x))
                    for x in read.batches] == [(0, (7, 0)), (1, (8, 0))]
            assert (await led.append(make_batch([b"after"]), now())).base_offset == 2
        finally:
            await a.close()
            await b.close()

    run(body)
