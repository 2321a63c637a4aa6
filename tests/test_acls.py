"""ACLs: the authorizer's rules (Kafka's AclAuthorizer), the ACL admin APIs, and
an in-process wire matrix of allowed and denied operations with Kafka's codes,
where nothing unauthorized is written or read."""

from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode
from kio.static.primitive import Records

from kafka_gateway.client import ClientSecurity, KafkaClient
from kafka_gateway.security.acls import (
    AclBinding,
    AclFilter,
    InvalidAcl,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from kafka_gateway.security.scram import from_password
from testkit.batches import make_batch
from testkit.inprocess import port_of, running
from testkit.kafka_requests import Versions, ms

T, G, TX, C = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID,
               ResourceType.CLUSTER)
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
V = Versions(1 << 10)  # every API at its newest version
PRODUCE, FETCH, METADATA, OFFSET_COMMIT, FIND_COORDINATOR, JOIN = 0, 1, 3, 8, 10, 11
CREATE_TOPICS, DELETE_TOPICS, INIT_PID, DESCRIBE_CONFIGS = 19, 20, 22, 32
DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS, LIST_GROUPS, OFFSET_FETCH = 29, 30, 31, 16, 9
ADD_PARTITIONS, TXN_OFFSET_COMMIT, END_TXN = 24, 28, 26


def acl(rtype, name, principal, operation, permission=ALLOW, pattern=LIT, host="*"):
    return AclBinding(rtype, name, pattern, principal, host, operation, permission)


def test_rules(tmp_path):
    async def main():
        async with running(tmp_path, authorizer_class_name="acl",
                           super_users="User:root;User:CN=ops") as server:
            auth = server.broker.authorizer
            await auth.create([
                acl(T, "orders-", "User:alice", Operation.READ, pattern=PRE),
                acl(T, "orders-secret", "User:alice", Operation.READ, DENY),
                acl(T, "*", "User:bob", Operation.WRITE),
                acl(T, "logs", "User:*", Operation.ALL, host="10.0.0.1"),
                acl(T, "cfg", "User:alice", Operation.ALTER_CONFIGS),
                acl(G, "g", "User:alice", Operation.READ),
            ])
            allows = auth.allows
            assert allows("User:alice", "127.0.0.1", Operation.READ, T, "orders-eu")
            assert not allows("User:alice", "127.0.0.1", Operation.READ, T, "orders-secret")
            assert not allows("User:alice", "127.0.0.1", Operation.WRITE, T, "orders-eu")
            # READ implies DESCRIBE; the DENY READ does not deny DESCRIBE.
            assert allows("User:alice", "127.0.0.1", Operation.DESCRIBE, T, "orders-secret")
            assert allows("User:alice", "127.0.0.1", Operation.DESCRIBE_CONFIGS, T, "cfg")
            assert allows("User:bob", "127.0.0.1", Operation.WRITE, T, "anything")
            assert not allows("User:bob", "127.0.0.1", Operation.READ, T, "anything")
            assert allows("User:carol", "10.0.0.1", Operation.DELETE, T, "logs")
            assert not allows("User:carol", "127.0.0.1", Operation.DELETE, T, "logs")
            assert allows("User:root", "127.0.0.1", Operation.ALTER, C, "kafka-cluster")
            assert allows("User:CN=ops", "1.2.3.4", Operation.DELETE, G, "x")
            assert not allows("User:alice", "127.0.0.1", Operation.READ, G, "other")  # no ACL
            auth.allow_if_no_acl = True
            assert allows("User:alice", "127.0.0.1", Operation.READ, G, "other")
            assert not allows("User:alice", "127.0.0.1", Operation.WRITE, G, "g")  # ACLs exist
            auth.allow_if_no_acl = False
            # WRITE on any topic (idempotent producers, KIP-679).
            assert auth.allows_any("User:bob", "127.0.0.1", Operation.WRITE, T)
            assert auth.allows_any("User:carol", "10.0.0.1", Operation.WRITE, T)  # ALL on logs
            assert not auth.allows_any("User:alice", "127.0.0.1", Operation.WRITE, T)
            await auth.create([acl(T, "*", "User:bob", Operation.WRITE, DENY)])
            assert not auth.allows_any("User:bob", "127.0.0.1", Operation.WRITE, T)

            # Filters: ANY, MATCH, exact patterns; deletion returns what went.
            match = AclFilter(T, "orders-secret", PatternType.MATCH)
            assert {b.name for b in await auth.describe(match)} == {"orders-", "orders-secret", "*"}
            assert len(await auth.describe(AclFilter(principal="User:bob"))) == 2
            [gone] = await auth.delete([AclFilter(T, "orders-", PRE)])
            assert [b.name for b in gone] == ["orders-"]
            assert not allows("User:alice", "127.0.0.1", Operation.READ, T, "orders-eu")

        # ACLs are kept in the store.
        async with running(tmp_path, authorizer_class_name="acl") as server:
            assert len(server.broker.authorizer.bindings) == 6

    asyncio.run(main())


def test_invalid_bindings():
    for binding, message in [
        (acl(C, "other", "User:a", Operation.ALTER), "kafka-cluster"),
        (acl(G, "g", "User:a", Operation.WRITE), "not supported"),
        (acl(T, "t", "alice", Operation.READ), "principal"),
        (acl(T, "", "User:a", Operation.READ), "empty"),
        (acl(T, "*", "User:a", Operation.READ, pattern=PRE), "wildcard"),
        (acl(T, "t", "User:a", Operation.ANY), "not supported"),
        (AclBinding(T, "t", PatternType.ANY, "User:a", "*", Operation.READ, ALLOW), "pattern"),
    ]:
        try:
            binding.validate()
        except InvalidAcl as exc:
            assert message in str(exc), (binding, exc)
        else:
            raise AssertionError(f"{binding} accepted")


async def _users(server, *names: str) -> None:
    await server.broker.credentials.change(
        [(name, from_password("SCRAM-SHA-256", f"{name}-secret")) for name in names], [])


async def _as(server, user: str) -> KafkaClient:
    return await KafkaClient.connect(
        "127.0.0.1", port_of(server, "SASL_PLAINTEXT"), security=ClientSecurity(
            mechanism="SCRAM-SHA-256", username=user, password=f"{user}-secret"))


def _creation(rtype, name, principal, operation, permission=ALLOW, pattern=LIT):
    return V.make(CREATE_ACLS, "AclCreation", resource_type=rtype, resource_name=name,
                  resource_pattern_type=pattern, principal=principal, host="*",
                  operation=operation, permission_type=permission)


async def _produce(client, topic: str, value: bytes, tid: str | None = None,
                   batch: bytes | None = None) -> ErrorCode:
    answer = await client.request(V.make(
        PRODUCE, "ProduceRequest", transactional_id=tid, acks=-1, timeout=ms(5000),
        topic_data=(V.make(PRODUCE, "TopicProduceData", name=topic, partition_data=(
            V.make(PRODUCE, "PartitionProduceData", index=0,
                   records=Records(batch or make_batch([value]))),)),)))
    return answer.responses[0].partition_responses[0].error_code


async def _fetch(client, topic_id):
    return await client.request(V.make(
        FETCH, "FetchRequest", replica_id=-1, max_wait=ms(0), min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1, cluster_id=None, rack_id="",
        forgotten_topics_data=(), replica_state=None,
        topics=(V.make(FETCH, "FetchTopic", topic=None, topic_id=topic_id, partitions=(
            V.make(FETCH, "FetchPartition", partition=0, current_leader_epoch=-1,
                   fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
                   partition_max_bytes=1 << 20),)),)))


def test_wire_matrix(tmp_path):
    async def main():
        async with running(tmp_path, listeners="PLAINTEXT://127.0.0.1:0,"
                                               "SASL_PLAINTEXT://127.0.0.1:0",
                           authorizer_class_name="acl", super_users="User:admin",
                           num_partitions=1) as server:
            await _users(server, "admin", "alice", "bob")
            admin = await _as(server, "admin")
            created = await admin.request(V.make(CREATE_TOPICS, "CreateTopicsRequest",
                timeout=ms(5000), validate_only=False, topics=tuple(
                    V.make(CREATE_TOPICS, "CreatableTopic", name=name, num_partitions=1,
                           replication_factor=1, assignments=(), configs=())
                    for name in ("orders", "secret", "audit"))))
            assert {t.error_code for t in created.topics} == {ErrorCode.none}
            answer = await admin.request(V.make(CREATE_ACLS, "CreateAclsRequest", creations=(
                _creation(T, "orders", "User:alice", Operation.WRITE),
                _creation(T, "orders", "User:alice", Operation.READ),
                _creation(T, "aud", "User:alice", Operation.DESCRIBE, pattern=PRE),
                _creation(G, "app", "User:alice", Operation.READ),
                _creation(TX, "tx-alice", "User:alice", Operation.WRITE),
                _creation(C, "other", "User:alice", Operation.ALTER),  # invalid name
            )))
            assert [r.error_code for r in answer.results] == [ErrorCode.none] * 5 + [
                ErrorCode.invalid_request]
            alice, bob = await _as(server, "alice"), await _as(server, "bob")
            orders = server.broker.engine.topic("orders").partitions[0]
            secret = server.broker.engine.topic("secret").partitions[0]

            # Produce: WRITE on the topic; nothing refused is stored.
            assert await _produce(alice, "orders", b"ok") is ErrorCode.none
            assert await _produce(alice, "secret", b"no") is ErrorCode.topic_authorization_failed
            assert await _produce(alice, "nowhere", b"no") is ErrorCode.topic_authorization_failed
            assert await _produce(bob, "orders", b"no") is ErrorCode.topic_authorization_failed
            assert (orders.high_watermark, secret.high_watermark) == (1, 0)

            # Fetch: READ on the topic; nothing is read from a refused one.
            assert await _produce(admin, "secret", b"hidden") is ErrorCode.none
            for client, topic, code in [(alice, "orders", ErrorCode.none),
                                        (alice, "secret", ErrorCode.topic_authorization_failed),
                                        (bob, "orders", ErrorCode.topic_authorization_failed)]:
                answer = await _fetch(client, server.broker.engine.topic(topic).topic_id)
                [part] = answer.responses[0].partitions
                assert part.error_code is code
                assert (part.records is None or len(bytes(part.records)) == 0) == bool(code)

            # Metadata: all topics hides the undescribable; named ones are refused.
            listing = await alice.request(V.make(
                METADATA, "MetadataRequest", topics=None, allow_auto_topic_creation=False,
                include_topic_authorized_operations=False))
            assert sorted(t.name for t in listing.topics) == ["audit", "orders"]
            named = await alice.request(V.make(
                METADATA, "MetadataRequest", allow_auto_topic_creation=True,
                include_topic_authorized_operations=False, topics=tuple(
                    V.make(METADATA, "MetadataRequestTopic", name=n, topic_id=None)
                    for n in ("orders", "secret", "new-topic"))))
            assert [(t.name, t.error_code) for t in named.topics] == [
                ("orders", ErrorCode.none), ("secret", ErrorCode.topic_authorization_failed),
                ("new-topic", ErrorCode.topic_authorization_failed)]
            assert "new-topic" not in server.broker.engine.topics

            # Groups: READ on the group.
            for group, code in (("app", ErrorCode.none),
                                ("other", ErrorCode.group_authorization_failed)):
                found = await alice.request(V.make(
                    FIND_COORDINATOR, "FindCoordinatorRequest", key_type=0,
                    coordinator_keys=(group,)))
                assert found.coordinators[0].error_code is code
                commit = await alice.request(V.make(
                    OFFSET_COMMIT, "OffsetCommitRequest", group_id=group,
                    generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                    retention_time_ms=-1, topics=(V.make(
                        OFFSET_COMMIT, "OffsetCommitRequestTopic", name="orders", partitions=(
                            V.make(OFFSET_COMMIT, "OffsetCommitRequestPartition",
                                   partition_index=0, committed_offset=1,
                                   committed_leader_epoch=-1, commit_timestamp=-1,
                                   committed_metadata=""),)),)))
                assert commit.topics[0].partitions[0].error_code is code
            joined = await alice.request(V.make(
                JOIN, "JoinGroupRequest", group_id="other", session_timeout=ms(10000),
                rebalance_timeout=ms(10000), member_id="", group_instance_id=None,
                protocol_type="consumer", reason=None, protocols=(V.make(
                    JOIN, "JoinGroupRequestProtocol", name="range", metadata=b""),)))
            assert joined.error_code is ErrorCode.group_authorization_failed
            assert server.broker.engine.consumer_offsets.group_offsets("other") == {}

            # Producer ids: a transactional id needs WRITE on it; idempotence WRITE on a topic.
            for client, tid, code in [
                (alice, "tx-alice", ErrorCode.none),
                (alice, "tx-bob", ErrorCode.transactional_id_authorization_failed),
                (alice, None, ErrorCode.none),
                (bob, None, ErrorCode.cluster_authorization_failed),
            ]:
                init = await client.request(V.make(
                    INIT_PID, "InitProducerIdRequest", transactional_id=tid,
                    transaction_timeout=ms(60000), producer_id=-1, producer_epoch=-1))
                assert init.error_code is code, (tid, init)
            refused = await alice.request(V.make(
                END_TXN, "EndTxnRequest", transactional_id="tx-bob", producer_id=1,
                producer_epoch=0, committed=True))
            assert refused.error_code is ErrorCode.transactional_id_authorization_failed
            txn_batch = make_batch([b"t"], producer_id=1, producer_epoch=0, base_sequence=0,
                                   attributes=0x10)
            assert await _produce(alice, "orders", b"", tid="tx-bob", batch=txn_batch) is (
                ErrorCode.transactional_id_authorization_failed)
            assert orders.high_watermark == 1

            # Admin: the cluster and topic operations.
            create = await alice.request(V.make(
                CREATE_TOPICS, "CreateTopicsRequest", timeout=ms(5000), validate_only=False,
                topics=(V.make(CREATE_TOPICS, "CreatableTopic", name="mine", num_partitions=1,
                               replication_factor=1, assignments=(), configs=()),)))
            assert create.topics[0].error_code is ErrorCode.topic_authorization_failed
            delete = await alice.request(V.make(
                DELETE_TOPICS, "DeleteTopicsRequest", timeout=ms(5000), topic_names=(),
                topics=(V.make(DELETE_TOPICS, "DeleteTopicState", name="orders",
                               topic_id=None),)))
            assert delete.responses[0].error_code is ErrorCode.topic_authorization_failed
            assert "orders" in server.broker.engine.topics
            configs = await alice.request(V.make(
                DESCRIBE_CONFIGS, "DescribeConfigsRequest", include_synonyms=False,
                include_documentation=False, resources=(
                    V.make(DESCRIBE_CONFIGS, "DescribeConfigsResource", resource_type=4,
                           resource_name="0", configuration_keys=None),
                    V.make(DESCRIBE_CONFIGS, "DescribeConfigsResource", resource_type=2,
                           resource_name="orders", configuration_keys=None),
                    V.make(DESCRIBE_CONFIGS, "DescribeConfigsResource", resource_type=2,
                           resource_name="secret", configuration_keys=None))))
            # READ and WRITE do not imply DESCRIBE_CONFIGS.
            assert [r.error_code for r in configs.results] == [
                ErrorCode.cluster_authorization_failed, ErrorCode.topic_authorization_failed,
                ErrorCode.topic_authorization_failed]
            acls = await alice.request(V.make(
                CREATE_ACLS, "CreateAclsRequest",
                creations=(_creation(T, "secret", "User:alice", Operation.READ),)))
            assert acls.results[0].error_code is ErrorCode.cluster_authorization_failed
            described = await alice.request(V.make(
                DESCRIBE_ACLS, "DescribeAclsRequest", resource_type_filter=1,
                resource_name_filter=None, pattern_type_filter=1, principal_filter=None,
                host_filter=None, operation=1, permission_type=1))
            assert described.error_code is ErrorCode.cluster_authorization_failed
            described = await admin.request(V.make(
                DESCRIBE_ACLS, "DescribeAclsRequest", resource_type_filter=1,
                resource_name_filter=None, pattern_type_filter=1,
                principal_filter="User:alice", host_filter=None, operation=1,
                permission_type=1))
            assert sum(len(r.acls) for r in described.resources) == 5
            deleted = await admin.request(V.make(
                DELETE_ACLS, "DeleteAclsRequest", filters=(V.make(
                    DELETE_ACLS, "DeleteAclsFilter", resource_type_filter=2,
                    resource_name_filter="orders", pattern_type_filter=3,
                    principal_filter=None, host_filter=None, operation=4,
                    permission_type=1),)))
            assert [m.operation for m in deleted.filter_results[0].matching_acls] == [4]
            assert await _produce(alice, "orders", b"no") is ErrorCode.topic_authorization_failed
            assert server.broker.metrics.authorization_failures >= 10
            for client in (admin, alice, bob):
                await client.close()

        # No authorizer: the ACL APIs answer SECURITY_DISABLED, everything else is allowed.
        async with running(tmp_path / "open") as server:
            client = await KafkaClient.connect(*server.config.listen)
            described = await client.request(V.make(
                DESCRIBE_ACLS, "DescribeAclsRequest", resource_type_filter=1,
                resource_name_filter=None, pattern_type_filter=1, principal_filter=None,
                host_filter=None, operation=1, permission_type=1))
            assert described.error_code is ErrorCode.security_disabled
            assert await _produce(client, "free", b"x") in (
                ErrorCode.none, ErrorCode.unknown_topic_or_partition)
            await client.close()

    asyncio.run(main())
