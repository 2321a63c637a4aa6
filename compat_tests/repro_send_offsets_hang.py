"""A minimal reproduction of the client hang the exactly-once chaos check met
on three gateways (docs/cluster.md, "The exactly-once chaos check"): with
librdkafka (confluent-kafka), ``send_offsets_to_transaction`` blocks past
its timeout, for good, when the group coordinator's broker was killed and
then left Metadata (confluentinc/librdkafka#5511: the decommissioned broker
stays the cached coordinator and TxnOffsetCommit waits for a state change of
a broker thread that is gone; #5456: the request's own timeout is never
checked). A Kafka broker that dies leaves Metadata the same way.

    python3 -m compat_tests.repro_send_offsets_hang     # about 90 s

Three gateways on a throwaway PostgreSQL (lease 3 s); a consumer of group G
reads a record; a transactional producer whose id another gateway
coordinates writes to a partition another gateway leads; then G's
coordinator is killed with kill -9, and
``send_offsets_to_transaction(..., 10)`` is called. It prints how long the
call took, or that it was still blocked after ``WAIT_S``, and whether the
killed gateway had left the survivors' Metadata by then. Not in the suite:
it checks a client's bug, not the gateway.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from kio.schema.errors import ErrorCode

from kafka_gateway.client import KafkaClient
from testkit import kafka_requests as rq
from testkit.cluster_faults import cluster_view, node_of
from testkit.gateway import GatewayProcess
from testkit.pg_cluster import create, running_cluster
from testkit.postgres import PostgresServer

WAIT_S = 60.0
TIMEOUT_S = 10.0  # send_offsets_to_transaction's own timeout
LEASE_MS = 9000  # broker.session.timeout.ms: the default, as in the chaos check


def coordinator(gateway: GatewayProcess, key: str, key_type: int) -> int:
    async def ask() -> int:
        client = await KafkaClient.connect(*gateway.host_port)
        try:
            found = (await client.request(rq.find_coordinator([key], key_type))).coordinators[0]
        finally:
            await client.close()
        assert found.error_code is ErrorCode.none, found
        return int(found.node_id)

    return asyncio.run(asyncio.wait_for(ask(), 30))


def main() -> None:
    with PostgresServer() as pg, running_cluster(Path(tempfile.mkdtemp()), pg.dsn,
                                                 lease_ms=LEASE_MS) as gateways:
        bootstrap = ",".join(g.bootstrap for g in gateways)
        create(gateways[0], "in", partitions=1)
        create(gateways[0], "out", partitions=6)
        group = "repro-group"
        group_node = coordinator(gateways[0], group, 0)
        txn_id = next(f"repro-{i}" for i in range(100)
                      if coordinator(gateways[0], f"repro-{i}", 1) != group_node)
        view = cluster_view(gateways[0], ["out"], [], [])
        out_partition = next(p for (_t, p), leader in view.leaders.items()
                             if leader != group_node)
        victim = next(g for g in gateways if node_of(g) == group_node)
        survivor = next(g for g in gateways if g is not victim)

        feed = Producer({"bootstrap.servers": bootstrap})
        feed.produce("in", b"x")
        assert feed.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "isolation.level": "read_committed"})
        consumer.subscribe(["in"])
        message = None
        deadline = time.monotonic() + 60
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(1.0)
        assert message is not None and message.error() is None, message
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce("out", b"y", partition=out_partition)
        assert producer.flush(30) == 0

        victim.kill_alone()
        killed = time.monotonic()
        print(f"killed node {group_node} (group coordinator; txn coordinator "
              f"{coordinator(survivor, txn_id, 1)}, out[{out_partition}] led by "
              f"{view.leaders[('out', out_partition)]})")
        outcome: dict[str, object] = {}

        def send() -> None:
            try:
                producer.send_offsets_to_transaction(
                    [TopicPartition("in", 0, message.offset() + 1)],
                    consumer.consumer_group_metadata(), TIMEOUT_S)
                outcome["result"] = "returned"
            except KafkaException as exc:
                outcome["result"] = f"raised {exc.args[0].name()}"
            outcome["seconds"] = time.monotonic() - killed

        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        thread.join(WAIT_S)
        listed = cluster_view(survivor, [], [], []).brokers
        if thread.is_alive():
            print(f"send_offsets_to_transaction(timeout {TIMEOUT_S:.0f} s): still blocked "
                  f"{time.monotonic() - killed:.1f} s after the kill; the survivors' Metadata "
                  f"lists {sorted(listed)}; group coordinator now "
                  f"{coordinator(survivor, group, 0)}")
            code = 1
        else:
            print(f"send_offsets_to_transaction(timeout {TIMEOUT_S:.0f} s): "
                  f"{outcome['result']} after {outcome['seconds']:.1f} s")
            code = 0
        sys.stdout.flush()
    os._exit(code)  # a blocked librdkafka call keeps the process from exiting


if __name__ == "__main__":
    main()
