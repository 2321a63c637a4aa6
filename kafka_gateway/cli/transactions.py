"""``kafka-gateway transactions list|describe|producers|abort``: transactions of a
running gateway, like ``kafka-transactions.sh``.

- ``list``: every transactional id with its producer id and state;
- ``describe TXN_ID``: state, producer id and epoch, timeout, start time and
  the partitions of the open transaction;
- ``producers TOPIC PARTITION``: the idempotent and transactional producers a
  partition knows (``describe-producers``);
- ``abort TXN_ID``: abort the open transaction of an id and fence its
  producer (what ``kafka-transactions.sh force-terminate`` does in Kafka 4:
  an InitProducerId for the id, which aborts and bumps the epoch).
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from kio.schema.describe_producers.v0 import request as describe_producers
from kio.schema.describe_transactions.v0 import request as describe_transactions
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4 import request as init_producer_id
from kio.schema.list_transactions.v0 import request as list_transactions
from kio.static.primitive import i32Timedelta

from ..client import KafkaClient
from ..cluster_client import TRANSACTION, ClusterClient
from .common import client_action, client_command, connected, print_rows, to_every_broker
from .describe_transactions_answer import DescribedTxn, decode_describe_transactions

ABORT_TIMEOUT = i32Timedelta.parse(datetime.timedelta(minutes=1))


def add_transactions_parser(commands: argparse._SubParsersAction) -> None:
    txns = client_command(commands, "transactions",
                          help="inspect and abort transactions on a running gateway",
                          description=__doc__)
    actions = txns.add_subparsers(dest="action", required=True)
    client_action(actions, "list", help="transactional ids with producer id and state")
    describe = client_action(actions, "describe", help="one transactional id in detail")
    describe.add_argument("transactional_id", help="the transactional.id of a producer")
    producers = client_action(actions, "producers",
                              help="idempotent and transactional producers of a partition")
    producers.add_argument("topic", help="the topic")
    producers.add_argument("partition", type=int, help="the partition index")
    abort = client_action(actions, "abort",
                          help="abort an id's open transaction, fencing its producer")
    abort.add_argument("transactional_id", help="the transactional.id of a producer")


async def run_transactions(args: argparse.Namespace) -> int:
    async with connected(args) as client:
        if args.action == "list":
            return await _list(client)
        if args.action == "producers":
            return await _producers(client, args.topic, args.partition)
        state = await _describe(client, args.transactional_id)
        if state is None:
            return 1
        if args.action == "describe":
            _print_state(state)
            return 0
        return await _abort(client, state)


async def _list(client: ClusterClient) -> int:
    """ListTransactions of every broker (each lists the ids it coordinates)."""
    answers, status = await to_every_broker(
        client, "list transactions",
        list_transactions.ListTransactionsRequest(state_filters=(), producer_id_filters=()))
    listed = {t.transactional_id: t for answer in answers for t in answer.transaction_states}
    print_rows([("TRANSACTIONAL-ID", "PRODUCER-ID", "STATE")] + [
        (t.transactional_id, str(t.producer_id), t.transaction_state)
        for _, t in sorted(listed.items())])
    return status


async def _describe(client: ClusterClient, transactional_id: str) -> DescribedTxn | None:
    async def send(coordinator: KafkaClient) -> DescribedTxn:
        frame = await coordinator.request_frame(
            describe_transactions.DescribeTransactionsRequest(
                transactional_ids=(transactional_id,)))
        [state] = decode_describe_transactions(frame)
        return state

    state = await client.to_coordinator(f"describe {transactional_id}", transactional_id,
                                        TRANSACTION, send, lambda state: state.error_code)
    code = state.error_code
    if code is ErrorCode.transactional_id_not_found:
        print(f"Transactional id {transactional_id} does not exist.")
        return None
    if code is not ErrorCode.none:
        raise SystemExit(f"describe {transactional_id}: {code.name.upper()}")
    return state


def _print_state(state: DescribedTxn) -> None:
    started = "-"
    if state.start_ms >= 0:
        started = datetime.datetime.fromtimestamp(state.start_ms / 1000,
                                                  tz=datetime.UTC).isoformat()
    print_rows([("TRANSACTIONAL-ID", "PRODUCER-ID", "EPOCH", "STATE", "TIMEOUT-MS", "START-TIME",
            "PARTITIONS"),
           (state.transactional_id, str(state.producer_id), str(state.producer_epoch),
            state.state, str(state.timeout_ms), started,
            ",".join(f"{t}-{p}" for t, ps in state.topics for p in ps) or "-")])


async def _producers(client: ClusterClient, topic: str, partition: int) -> int:
    async def send(leader: KafkaClient) -> Any:
        response = await leader.request(describe_producers.DescribeProducersRequest(topics=(
            describe_producers.TopicRequest(name=topic, partition_indexes=(partition,)),)))
        return response.topics[0].partitions[0]

    result = await client.to_leader(f"producers {topic}-{partition}", topic, partition, send,
                                    lambda result: result.error_code)
    if result.error_code is not ErrorCode.none:
        raise SystemExit(f"producers {topic}-{partition}: {result.error_code.name.upper()}")
    print_rows([("PRODUCER-ID", "EPOCH", "LAST-SEQUENCE", "LAST-TIMESTAMP")] + [
        (str(p.producer_id), str(p.producer_epoch), str(p.last_sequence),
         datetime.datetime.fromtimestamp(p.last_timestamp / 1000, tz=datetime.UTC).isoformat())
        for p in result.active_producers])
    return 0


async def _abort(client: ClusterClient, state: DescribedTxn) -> int:
    if state.state != "Ongoing":
        print(f"Transactional id {state.transactional_id} has no open transaction "
              f"(state {state.state}): nothing to abort.")
        return 1
    response = await client.to_coordinator(
        f"abort {state.transactional_id}", state.transactional_id, TRANSACTION,
        lambda coordinator: coordinator.request(init_producer_id.InitProducerIdRequest(
            transactional_id=state.transactional_id, transaction_timeout=ABORT_TIMEOUT,
            producer_id=-1, producer_epoch=-1)),
        lambda answer: answer.error_code)
    if response.error_code is not ErrorCode.none:
        raise SystemExit(f"abort {state.transactional_id}: {response.error_code.name.upper()}")
    print(f"Aborted the open transaction of {state.transactional_id}; producer "
          f"{state.producer_id} epoch {state.producer_epoch} is fenced (now epoch "
          f"{response.producer_epoch}).")
    return 0
