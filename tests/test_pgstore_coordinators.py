"""Group coordinators in a cluster of PostgreSQL gateways (issue 22,
"Coordinators"), at engine level on a throwaway PostgreSQL: two gateways'
engines in one process, each with the protocol layer's ``GroupCoordinator``
wired as the server wires it.

- a group's generation is stored before members hear of it, and a group
  whose slot moves to the other gateway goes on from it there, then back
  again: it never goes backwards, and the gateway that lost the slot
  dropped the group's members (its waiting JoinGroup answered
  NOT_COORDINATOR);
- a stale coordinator (its slot's epoch moved under it, before its pass
  noticed) has its OffsetCommit and its new generation refused inside the
  PostgreSQL transaction (``CoordinatorMoved``: NOT_COORDINATOR), and
  nothing of either lands.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import pytest
from kio.schema.errors import ErrorCode

from kafka_gateway.errors import error_code
from kafka_gateway.groups import GroupCoordinator, GroupOffsets, JoinRequest, JoinResult
from kafka_gateway.settings import GatewayConfig
from pgstore.cluster import PgCluster
from pgstore.consumer_offsets import PgConsumerOffsets
from pgstore.leadership import coordinator_slot
from pgstore.migrate import quoted
from pgstore.node import PgNodeStorage
from tablets.errors import CoordinatorMoved
from tablets.seam import OffsetCommit
from testkit import postgres
from testkit.consumer_protocol import encode_assignment, encode_subscription
from testkit.pg_engines import move_slot, until
from testkit.pg_gateways import LEASE, join, started_node
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
TIMEOUT = 60


@dataclasses.dataclass
class Gateway:
    node: PgNodeStorage
    cluster: PgCluster
    offsets: PgConsumerOffsets
    groups: GroupCoordinator
    group_offsets: GroupOffsets


async def gateway(pg: PostgresServer, schema: str, node_id: int) -> Gateway:
    node, cluster, offsets = await started_node(pg, schema, node_id)
    config = dataclasses.replace(GatewayConfig(), group_initial_rebalance_delay_ms=50,
                                 group_min_session_timeout_ms=10)
    groups = GroupCoordinator(config, offsets)
    # As kafka_gateway/server.py wires them.
    cluster.watch_coordination(groups.drop_groups)
    groups.coordinates = cluster.coordinates
    await join(node, node_id)
    return Gateway(node, cluster, offsets, groups, GroupOffsets(config, groups, offsets))


def run(body: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(body(), TIMEOUT)

    asyncio.run(bounded())


def join_request(group: str, member_id: str = "") -> JoinRequest:
    metadata = encode_subscription(["t"])
    return JoinRequest(group, member_id, None, "client", "", "consumer",
                       [("range", metadata)], 5000, 2000, True)


async def join_one(groups: GroupCoordinator, group: str) -> JoinResult:
    """A new member through MEMBER_ID_REQUIRED, joined and synced alone."""
    first = await groups.join_group(join_request(group))
    assert first.error is ErrorCode.member_id_required, first
    return await sync(groups, group, await groups.join_group(join_request(group, first.member_id)))


async def sync(groups: GroupCoordinator, group: str, joined: JoinResult) -> JoinResult:
    """The sole member's SyncGroup after its JoinGroup."""
    assert joined.error is ErrorCode.none, joined
    synced = await groups.sync_group(group, joined.generation_id, joined.member_id, None,
                                     "consumer", joined.protocol_name,
                                     {joined.member_id: encode_assignment({"t": [0]})})
    assert synced.error is ErrorCode.none, synced
    return joined


async def stored_generation(pg: PostgresServer, schema: str, group: str) -> int:
    conn = await asyncpg.connect(pg.dsn)
    try:
        value = await conn.fetchval(
            f"SELECT generation FROM {quoted(schema)}.group_generations WHERE group_id = $1",
            group)
        return 0 if value is None else int(value)
    finally:
        await conn.close()


def lowest_group(cluster: PgCluster) -> str:
    """A group coordinated by ``cluster`` in the lowest slot it leads (a
    rebalancing pass hands over the highest ones, never this)."""
    assert cluster.leadership is not None
    slot = min(cluster.leadership.led_slots)
    return next(g for g in (f"group-{i}" for i in range(10_000)) if coordinator_slot(g) == slot)


def test_generation_follows_the_group_across_coordinator_moves(pg_server: PostgresServer) -> None:
    schema = f"coord_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        a = await gateway(pg_server, schema, 1)
        b = await gateway(pg_server, schema, 2)
        await a.node.create_topic("t", 1, {})
        await until(lambda: a.cluster.leadership is not None
                    and len(a.cluster.leadership.led_slots) == 25
                    and b.cluster.leadership is not None
                    and len(b.cluster.leadership.led_slots) == 25, "slots balanced", 4 * LEASE)
        group = lowest_group(a.cluster)
        slot = coordinator_slot(group)
        await until(lambda: a.cluster.coordinates(group), "coordinated by a", 3 * LEASE)

        # Three generations on a, each stored before the member heard of it.
        first = await join_one(a.groups, group)
        member = first.member_id
        generations = [first.generation_id]
        for _ in range(2):  # the leader rejoins: a rebalance each time
            again = await sync(a.groups, group, await a.groups.join_group(
                join_request(group, member)))
            generations.append(again.generation_id)
        assert generations == [1, 2, 3]
        assert await stored_generation(pg_server, schema, group) == 3
        code = await a.group_offsets.commit_offsets(
            group, 3, member, None, {("t", 0): OffsetCommit(5, -1, "")})
        assert code is ErrorCode.none

        # A member of a waits in a new join phase when the slot moves to b:
        # a drops the group and answers it NOT_COORDINATOR.
        waiting = asyncio.ensure_future(a.groups.join_group(join_request(group)))
        pending = await waiting
        assert pending.error is ErrorCode.member_id_required
        waiting = asyncio.ensure_future(
            a.groups.join_group(join_request(group, pending.member_id)))
        await asyncio.sleep(0.01)
        await move_slot(pg_server, schema, slot, 2)
        await until(lambda: b.cluster.coordinates(group), "coordinated by b", 3 * LEASE)
        dropped = await asyncio.wait_for(waiting, 3 * LEASE)
        assert dropped.error is ErrorCode.not_coordinator, dropped
        assert group not in a.groups.groups and not a.cluster.coordinates(group)

        # On b: the offsets and the generation as a left them; the next is 4.
        assert b.offsets.committed(group, "t", 0) is not None
        assert b.offsets.committed(group, "t", 0).offset == 5  # type: ignore[union-attr]
        assert b.offsets.generation(group) == 3
        moved = await join_one(b.groups, group)
        assert moved.generation_id == 4
        assert await stored_generation(pg_server, schema, group) == 4

        # Back to a: it starts from storage (4), not from what it had (3).
        await move_slot(pg_server, schema, slot, 1)
        await until(lambda: a.cluster.coordinates(group), "coordinated by a again", 3 * LEASE)
        await until(lambda: group not in b.groups.groups, "dropped by b", 3 * LEASE)
        back = await join_one(a.groups, group)
        assert back.generation_id == 5
        assert await stored_generation(pg_server, schema, group) == 5
        # A member of b's generation is a stranger on a.
        stale = await a.group_offsets.commit_offsets(
            group, moved.generation_id, moved.member_id, None,
            {("t", 0): OffsetCommit(9, -1, "")})
        assert stale in (ErrorCode.unknown_member_id, ErrorCode.illegal_generation)
        assert a.offsets.committed(group, "t", 0).offset == 5  # type: ignore[union-attr]
        a.groups.stop()
        b.groups.stop()
        await a.node.close()
        await b.node.close()

    run(body)


def test_a_stale_coordinator_writes_nothing(pg_server: PostgresServer) -> None:
    """Its slot moved in PostgreSQL, its pass has not noticed yet: its
    OffsetCommit and its next generation are refused in the transaction."""
    schema = f"coord_{uuid.uuid4().hex[:10]}"

    async def body() -> None:
        a = await gateway(pg_server, schema, 1)
        await a.node.create_topic("t", 1, {})
        group = "stale-group"
        slot = coordinator_slot(group)
        await until(lambda: a.cluster.coordinates(group), "coordinated by a", 3 * LEASE)
        held = a.cluster.slot_held(group)
        assert held is not None and held[:2] == (slot, 1)
        await a.offsets.commit(group, {("t", 0): OffsetCommit(3, -1, "")}, 1)
        assert await a.offsets.next_generation(group, 0) == 1

        # The slot goes to node 2 (as a takeover does); a's view is pinned to
        # what it held, as it is until its next pass reads the row.
        new_epoch = await move_slot(pg_server, schema, slot, 2)
        assert new_epoch > held[2]
        a.offsets.slot_holder = lambda _group: held
        with pytest.raises(CoordinatorMoved) as refused:
            await a.offsets.commit(group, {("t", 0): OffsetCommit(7, -1, "")}, 2)
        assert error_code(refused.value) is ErrorCode.not_coordinator
        with pytest.raises(CoordinatorMoved):
            await a.offsets.next_generation(group, 1)
        with pytest.raises(CoordinatorMoved):
            await a.offsets.delete(group)
        # DeleteGroups through the protocol layer answers it.
        assert await a.group_offsets.delete_group(group) is ErrorCode.not_coordinator

        # Nothing of them landed: the row is the first commit's, the
        # generation still 1, and a reread agrees.
        conn = await asyncpg.connect(pg_server.dsn)
        try:
            row = await conn.fetchrow(
                f"SELECT committed_offset FROM {quoted(schema)}.consumer_offsets "
                "WHERE group_id = $1", group)
            await a.offsets.load_group(conn, group)
        finally:
            await conn.close()
        assert row is not None and row["committed_offset"] == 3
        assert await stored_generation(pg_server, schema, group) == 1
        assert a.offsets.committed(group, "t", 0).offset == 3  # type: ignore[union-attr]
        assert a.offsets.generation(group) == 1
        # Without the pin, a's own view refuses at once (no write tried).
        a.offsets.slot_holder = lambda _group: None
        with pytest.raises(CoordinatorMoved):
            await a.offsets.commit(group, {("t", 0): OffsetCommit(8, -1, "")}, 3)
        a.groups.stop()
        await a.node.close()

    run(body)
