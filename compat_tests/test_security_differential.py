"""The same denied (and allowed) operations against the gateway and Apache Kafka
3.4.1 configured the same way: a SASL_PLAINTEXT listener with PLAIN users,
the ACL authorizer (StandardAuthorizer, KRaft) with a super user, the same
ACLs. Every request is sent as raw protocol by the same client
(kafka_gateway.client) and the answers' error codes (and listings) compared.

Kafka's PLAIN users are in its JAAS config; the gateway's are SCRAM
credentials (PLAIN is checked against them): the same names and passwords.
"""

from __future__ import annotations

import asyncio
import datetime
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kio.schema.add_partitions_to_txn.v3 import request as add_partitions
from kio.schema.create_acls.v3 import request as create_acls
from kio.schema.create_partitions.v3 import request as create_partitions
from kio.schema.create_topics.v7 import request as create_topics
from kio.schema.delete_acls.v3 import request as delete_acls
from kio.schema.delete_groups.v2 import request as delete_groups
from kio.schema.delete_records.v2 import request as delete_records
from kio.schema.delete_topics.v6 import request as delete_topics
from kio.schema.describe_acls.v3 import request as describe_acls
from kio.schema.describe_configs.v4 import request as describe_configs
from kio.schema.describe_groups.v5 import request as describe_groups
from kio.schema.describe_producers.v0 import request as describe_producers
from kio.schema.describe_transactions.v0 import request as describe_transactions
from kio.schema.end_txn.v3 import request as end_txn
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch
from kio.schema.find_coordinator.v4 import request as find_coordinator
from kio.schema.incremental_alter_configs.v1 import request as alter_configs
from kio.schema.init_producer_id.v4 import request as init_producer_id
from kio.schema.join_group.v9 import request as join_group
from kio.schema.list_groups.v4 import request as list_groups
from kio.schema.list_offsets.v7 import request as list_offsets
from kio.schema.list_transactions.v0 import request as list_transactions
from kio.schema.metadata.v12 import request as metadata
from kio.schema.offset_commit.v8 import request as offset_commit
from kio.schema.offset_fetch.v8 import request as offset_fetch
from kio.schema.produce.v9 import request as produce
from kio.schema.sasl_handshake.v1 import request as sasl_handshake
from kio.static.primitive import Records, i32Timedelta

from kafka_gateway.cli.describe_transactions_answer import decode_describe_transactions
from kafka_gateway.client import AuthenticationError, ClientSecurity, KafkaClient
from testkit.batches import make_batch
from testkit.gateway import GatewayProcess
from testkit.kafka_broker import KafkaBroker

USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
TOPIC, GROUP, TXN, OTHER, WILDCARD_ALL = 2, 3, 5, 4, 1
ALLOW, DENY = 3, 2
READ, WRITE, DESCRIBE, ALL = 3, 4, 8, 2
RETRIABLE = {ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available,
             ErrorCode.not_coordinator, ErrorCode.leader_not_available,
             ErrorCode.not_leader_or_follower, ErrorCode.concurrent_transactions}


def ms(value: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


# The ACLs both servers get (besides the super user): alice's.
ACLS = [(TOPIC, "d-orders", 3, "User:alice", WRITE, ALLOW),
        (TOPIC, "d-orders", 3, "User:alice", READ, ALLOW),
        (TOPIC, "d-aud", 4, "User:alice", DESCRIBE, ALLOW),
        (TOPIC, "d-", 4, "User:alice", READ, ALLOW),
        (TOPIC, "d-secret", 3, "User:alice", ALL, DENY),
        (GROUP, "d-app", 3, "User:alice", READ, ALLOW),
        (TXN, "d-tx", 3, "User:alice", WRITE, ALLOW)]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    directory = tmp_path_factory.mktemp("secure-diff")
    jaas = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
            + " ".join(f'user_{u}="{p}"' for u, p in USERS.items()) + ";")
    kafka = KafkaBroker(directory / "kafka", listeners={"SASL_PLAINTEXT": "SASL_PLAINTEXT"},
                        overrides={
                            "sasl.enabled.mechanisms": "PLAIN",
                            "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
                            "authorizer.class.name":
                                "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                            # ANONYMOUS: the node's own PLAINTEXT/CONTROLLER listeners.
                            "super.users": "User:admin;User:ANONYMOUS",
                            "auto.create.topics.enable": "true",
                        })
    gateway = GatewayProcess(directory / "gateway" / "data", "--listeners",
                             "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                             "--sasl-enabled-mechanisms", "PLAIN", "--authorizer-class-name",
                             "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                             "--super-users", "User:admin;User:ANONYMOUS")
    with kafka, gateway:
        asyncio.run(_add_gateway_users(gateway))
        yield {"kafka": ("127.0.0.1", kafka.listener_ports["SASL_PLAINTEXT"]),
               "gateway": ("127.0.0.1", gateway.listener_ports["SASL_PLAINTEXT"])}


async def _add_gateway_users(gateway: GatewayProcess) -> None:
    from kio.schema.alter_user_scram_credentials.v0 import request as alter_scram

    from kafka_gateway.security.scram import MECHANISMS

    client = await KafkaClient.connect("127.0.0.1", gateway.listener_ports["PLAINTEXT"])
    import hashlib
    import os
    upserts = []
    for user, password in USERS.items():
        salt = os.urandom(16)
        upserts.append(alter_scram.ScramCredentialUpsertion(
            name=user, mechanism=MECHANISMS["SCRAM-SHA-256"][1], iterations=4096, salt=salt,
            salted_password=hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 4096)))
    answer = await client.request(alter_scram.AlterUserScramCredentialsRequest(
        deletions=(), upsertions=tuple(upserts)))
    assert {r.error_code for r in answer.results} == {ErrorCode.none}
    await client.close()


async def _as(address, user: str, password: str | None = None) -> KafkaClient:
    return await KafkaClient.connect(*address, security=ClientSecurity(
        mechanism="PLAIN", username=user, password=USERS[user] if password is None
        else password))


async def _until(call: Callable[[], Awaitable[Any]], code: Callable[[Any], ErrorCode]) -> Any:
    """Retry while the answer's code says "not yet" (Kafka's coordinators load)."""
    deadline = time.monotonic() + 60
    while True:
        answer = await call()
        if code(answer) not in RETRIABLE or time.monotonic() > deadline:
            return answer
        await asyncio.sleep(0.2)


async def _setup(address) -> None:
    admin = await _as(address, "admin")
    answer = await admin.request(create_topics.CreateTopicsRequest(
        timeout=ms(30000), validate_only=False, topics=tuple(
            create_topics.CreatableTopic(name=name, num_partitions=1, replication_factor=1,
                                         assignments=(), configs=())
            for name in ("d-orders", "d-secret", "d-audit"))))
    assert {t.error_code for t in answer.topics} == {ErrorCode.none}, answer
    answer = await admin.request(create_acls.CreateAclsRequest(creations=tuple(
        create_acls.AclCreation(resource_type=rtype, resource_name=name,
                                resource_pattern_type=pattern, principal=principal, host="*",
                                operation=op, permission_type=permission)
        for rtype, name, pattern, principal, op, permission in ACLS)))
    assert {r.error_code for r in answer.results} == {ErrorCode.none}, answer
    # Kafka applies ACLs and topics through its metadata log: wait until they are in.
    deadline = time.monotonic() + 60
    while True:
        acls = await admin.request(describe_acls.DescribeAclsRequest(
            resource_type_filter=WILDCARD_ALL, resource_name_filter=None,
            pattern_type_filter=1, principal_filter="User:alice", host_filter=None,
            operation=1, permission_type=1))
        listed = await admin.request(metadata.MetadataRequest(
            topics=None, allow_auto_topic_creation=False,
            include_topic_authorized_operations=False))
        ready = {t.name for t in listed.topics if t.partitions and
                 all(p.leader_id >= 0 for p in t.partitions)}
        if (sum(len(r.acls) for r in acls.resources) == len(ACLS)
                and {"d-orders", "d-secret", "d-audit"} <= ready):
            break
        assert time.monotonic() < deadline, "ACLs and topics not in place"
        await asyncio.sleep(0.2)
    await _produce(admin, "d-secret", b"hidden")
    await admin.close()


async def _produce(client: KafkaClient, topic: str, value: bytes = b"v",
                   tid: str | None = None, batch: bytes | None = None) -> ErrorCode:
    answer = await _until(lambda: client.request(produce.ProduceRequest(
        transactional_id=tid, acks=-1, timeout=ms(10000), topic_data=(
            produce.TopicProduceData(name=topic, partition_data=(produce.PartitionProduceData(
                index=0, records=Records(batch or make_batch([value]))),)),))),
        lambda a: a.responses[0].partition_responses[0].error_code)
    return answer.responses[0].partition_responses[0].error_code


async def _scenario(address) -> dict[str, Any]:
    """What alice and bob are told; setup first (as admin)."""
    await _setup(address)
    out: dict[str, Any] = {}
    alice, bob = await _as(address, "alice"), await _as(address, "bob")

    out["produce allowed"] = await _produce(alice, "d-orders")
    out["produce denied"] = await _produce(alice, "d-secret")
    out["produce to a missing topic"] = await _produce(alice, "d-nowhere")
    out["produce, no ACL"] = await _produce(bob, "d-orders")
    out["produce transactional, id denied"] = await _produce(
        alice, "d-orders", tid="d-tx-other",
        batch=make_batch([b"t"], producer_id=7, producer_epoch=0, base_sequence=0,
                         attributes=0x10))

    fetched = await alice.request(fetch.FetchRequest(
        replica_id=-1, max_wait=ms(0), min_bytes=1, max_bytes=1 << 20, isolation_level=0,
        session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=(), topics=tuple(
            fetch.FetchTopic(topic=name, partitions=(fetch.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                log_start_offset=-1, partition_max_bytes=1 << 20),))
            for name in ("d-orders", "d-secret", "d-audit"))))
    # Sorted: Kafka puts refused partitions last, the gateway keeps request order.
    out["fetch"] = sorted((r.topic, r.partitions[0].error_code,
                           bool(r.partitions[0].records and len(bytes(r.partitions[0].records))))
                          for r in fetched.responses)

    listing = await alice.request(metadata.MetadataRequest(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    out["metadata, all topics"] = sorted(t.name for t in listing.topics
                                         if t.name.startswith("d-"))
    named = await alice.request(metadata.MetadataRequest(
        allow_auto_topic_creation=True, include_topic_authorized_operations=False,
        topics=tuple(metadata.MetadataRequestTopic(name=n, topic_id=None)
                     for n in ("d-orders", "d-secret", "d-brand-new"))))
    out["metadata, named"] = sorted((t.name, t.error_code) for t in named.topics)

    offsets = await alice.request(list_offsets.ListOffsetsRequest(
        replica_id=-1, isolation_level=0, topics=tuple(
            list_offsets.ListOffsetsTopic(name=n, partitions=(list_offsets.ListOffsetsPartition(
                partition_index=0, current_leader_epoch=-1, timestamp=-1),))
            for n in ("d-orders", "d-secret"))))
    out["list offsets"] = [(t.name, t.partitions[0].error_code) for t in offsets.topics]

    for group in ("d-app", "d-other"):
        found = await _until(lambda g=group: alice.request(find_coordinator.FindCoordinatorRequest(
            key_type=0, coordinator_keys=(g,))), lambda a: a.coordinators[0].error_code)
        out[f"find coordinator {group}"] = found.coordinators[0].error_code
        committed = await _until(lambda g=group: alice.request(offset_commit.OffsetCommitRequest(
            group_id=g, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
            topics=tuple(offset_commit.OffsetCommitRequestTopic(name=n, partitions=(
                offset_commit.OffsetCommitRequestPartition(
                    partition_index=0, committed_offset=0, committed_leader_epoch=-1,
                    committed_metadata=""),)) for n in ("d-orders", "d-secret")))),
            lambda a: a.topics[0].partitions[0].error_code)
        out[f"offset commit {group}"] = sorted(
            (t.name, t.partitions[0].error_code) for t in committed.topics)
        fetched_offsets = await _until(lambda g=group: alice.request(
            offset_fetch.OffsetFetchRequest(require_stable=False, groups=(
                offset_fetch.OffsetFetchRequestGroup(group_id=g, topics=None),))),
            lambda a: a.groups[0].error_code)
        out[f"offset fetch {group}"] = (fetched_offsets.groups[0].error_code, sorted(
            t.name for t in fetched_offsets.groups[0].topics))
    joined = await alice.request(join_group.JoinGroupRequest(
        group_id="d-other", session_timeout=ms(10000), rebalance_timeout=ms(10000),
        member_id="", group_instance_id=None, protocol_type="consumer", reason=None,
        protocols=(join_group.JoinGroupRequestProtocol(name="range", metadata=b""),)))
    out["join group denied"] = joined.error_code
    described = await alice.request(describe_groups.DescribeGroupsRequest(
        groups=("d-app", "d-other"), include_authorized_operations=False))
    out["describe groups"] = [(g.group_id, g.error_code) for g in described.groups]
    groups = await alice.request(list_groups.ListGroupsRequest(states_filter=()))
    out["list groups"] = sorted(g.group_id for g in groups.groups)
    deleted = await alice.request(delete_groups.DeleteGroupsRequest(groups_names=("d-other",)))
    out["delete group denied"] = deleted.results[0].error_code

    # As clients do: the coordinator first (Kafka creates its transaction log then).
    found = await _until(lambda: alice.request(find_coordinator.FindCoordinatorRequest(
        key_type=1, coordinator_keys=("d-tx", "d-tx-other"))),
        lambda a: a.coordinators[0].error_code)
    out["find transaction coordinator"] = [c.error_code for c in found.coordinators]
    for who, client, tid in (("alice", alice, "d-tx"), ("alice", alice, "d-tx-other"),
                             ("alice", alice, None), ("bob", bob, None)):
        init = await _until(lambda c=client, t=tid: c.request(
            init_producer_id.InitProducerIdRequest(
                transactional_id=t, transaction_timeout=ms(60000), producer_id=-1,
                producer_epoch=-1)), lambda a: a.error_code)
        out[f"init producer id {who} {tid}"] = init.error_code
    ended = await alice.request(end_txn.EndTxnRequest(
        transactional_id="d-tx-other", producer_id=1, producer_epoch=0, committed=True))
    out["end txn denied"] = ended.error_code
    added = await alice.request(add_partitions.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id="d-tx", v3_and_below_producer_id=1,
        v3_and_below_producer_epoch=0, v3_and_below_topics=(
            add_partitions.AddPartitionsToTxnTopic(name="d-orders", partitions=(0,)),
            add_partitions.AddPartitionsToTxnTopic(name="d-secret", partitions=(0,)))))
    out["add partitions, a topic denied"] = sorted(
        (t.name, t.results_by_partition[0].partition_error_code)
        for t in added.results_by_topic_v3_and_below)
    [described_txn] = decode_describe_transactions(await alice.request_frame(
        describe_transactions.DescribeTransactionsRequest(transactional_ids=("d-tx-other",))))
    out["describe transactions denied"] = described_txn.error_code
    listed_txns = await alice.request(list_transactions.ListTransactionsRequest(
        state_filters=(), producer_id_filters=()))
    out["list transactions"] = sorted(t.transactional_id for t in listed_txns.transaction_states)
    producers = await alice.request(describe_producers.DescribeProducersRequest(topics=(
        describe_producers.TopicRequest(name="d-secret", partition_indexes=(0,)),)))
    out["describe producers denied"] = producers.topics[0].partitions[0].error_code

    created = await alice.request(create_topics.CreateTopicsRequest(
        timeout=ms(10000), validate_only=False, topics=(create_topics.CreatableTopic(
            name="d-mine", num_partitions=1, replication_factor=1, assignments=(),
            configs=()),)))
    out["create topic denied"] = created.topics[0].error_code
    removed = await alice.request(delete_topics.DeleteTopicsRequest(
        timeout=ms(10000), topics=(delete_topics.DeleteTopicState(
            name="d-orders", topic_id=None),)))
    out["delete topic denied"] = removed.responses[0].error_code
    grown = await alice.request(create_partitions.CreatePartitionsRequest(
        timeout=ms(10000), validate_only=True, topics=(create_partitions.CreatePartitionsTopic(
            name="d-orders", count=2, assignments=None),)))
    out["create partitions denied"] = grown.results[0].error_code
    trimmed = await alice.request(delete_records.DeleteRecordsRequest(
        timeout=ms(10000), topics=(delete_records.DeleteRecordsTopic(name="d-secret", partitions=(
            delete_records.DeleteRecordsPartition(partition_index=0, offset=1),)),)))
    out["delete records denied"] = trimmed.topics[0].partitions[0].error_code
    configs = await alice.request(describe_configs.DescribeConfigsRequest(
        include_synonyms=False, include_documentation=False, resources=(
            describe_configs.DescribeConfigsResource(resource_type=4, resource_name="1",
                                                     configuration_keys=("num.partitions",)),
            describe_configs.DescribeConfigsResource(resource_type=2, resource_name="d-orders",
                                                     configuration_keys=None))))
    out["describe configs denied"] = [r.error_code for r in configs.results]
    altered = await alice.request(alter_configs.IncrementalAlterConfigsRequest(
        validate_only=True, resources=(alter_configs.AlterConfigsResource(
            resource_type=2, resource_name="d-orders", configs=(alter_configs.AlterableConfig(
                name="retention.ms", config_operation=0, value="1000"),)),)))
    out["alter configs denied"] = altered.responses[0].error_code
    acl_creation = await alice.request(create_acls.CreateAclsRequest(creations=(
        create_acls.AclCreation(resource_type=TOPIC, resource_name="d-secret",
                                resource_pattern_type=3, principal="User:alice", host="*",
                                operation=READ, permission_type=ALLOW),)))
    out["create acls denied"] = acl_creation.results[0].error_code
    acl_listing = await alice.request(describe_acls.DescribeAclsRequest(
        resource_type_filter=WILDCARD_ALL, resource_name_filter=None, pattern_type_filter=1,
        principal_filter=None, host_filter=None, operation=1, permission_type=1))
    out["describe acls denied"] = acl_listing.error_code
    acl_deletion = await alice.request(delete_acls.DeleteAclsRequest(filters=(
        delete_acls.DeleteAclsFilter(resource_type_filter=WILDCARD_ALL,
                                     resource_name_filter=None, pattern_type_filter=1,
                                     principal_filter=None, host_filter=None, operation=1,
                                     permission_type=1),)))
    out["delete acls denied"] = acl_deletion.filter_results[0].error_code
    for client in (alice, bob):
        await client.close()

    # Authentication: a wrong password, an unknown user, a mechanism not enabled;
    # the answer to a failure waits connection.failed.authentication.delay.ms (100).
    for user, password in (("alice", "wrong"), ("mallory", "x")):
        started = time.monotonic()
        try:
            await KafkaClient.connect(*address, security=ClientSecurity(
                mechanism="PLAIN", username=user, password=password))
            out[f"login {user}"] = "accepted"
        except AuthenticationError as exc:
            out[f"login {user}"] = str(exc)
        out[f"login {user} answered after 100 ms"] = time.monotonic() - started >= 0.1
    out["frame over sasl.server.max.receive.size before login"] = (
        await _oversized_frame_before_login(address))
    raw = await KafkaClient.connect(*address)
    handshake = await raw.request(sasl_handshake.SaslHandshakeRequest(mechanism="SCRAM-SHA-256"))
    out["handshake, mechanism not enabled"] = (handshake.error_code, handshake.mechanisms)
    await raw.close()
    return out


async def _oversized_frame_before_login(address) -> str:
    """A size prefix of 512 KiB + 1 as the first frame, and a few bytes of it."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(struct.pack(">i", 524_289) + bytes(1024))
        await writer.drain()
        data = await asyncio.wait_for(reader.read(1), 30)
        return "answered" if data else "closed unanswered"
    except ConnectionError:
        return "closed unanswered"
    finally:
        writer.close()


def test_same_answers_as_kafka(servers):
    kafka = asyncio.run(_scenario(servers["kafka"]))
    gateway = asyncio.run(_scenario(servers["gateway"]))
    differences = {key: (kafka[key], gateway.get(key)) for key in kafka
                   if kafka[key] != gateway.get(key)}
    assert not differences, "\n".join(f"{k}: kafka {a!r}, gateway {b!r}"
                                      for k, (a, b) in differences.items())
    # And the scenario really was refused where it should be.
    assert kafka["produce denied"] is ErrorCode.topic_authorization_failed
    assert kafka["join group denied"] is ErrorCode.group_authorization_failed
    assert kafka["end txn denied"] is ErrorCode.transactional_id_authorization_failed
    assert kafka["create acls denied"] is ErrorCode.cluster_authorization_failed
    assert kafka["login alice"].startswith("SASL_AUTHENTICATION_FAILED")
    assert kafka["login alice answered after 100 ms"] is True
    assert kafka["frame over sasl.server.max.receive.size before login"] == "closed unanswered"
