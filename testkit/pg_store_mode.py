"""The compatibility suite on the PostgreSQL store, on one gateway or a
cluster of three.

    KAFKA_GATEWAY_TEST_STORE=postgresql python3 -m pytest compat_tests/test_txn_confluent.py
    KAFKA_GATEWAY_TEST_STORE=postgresql-cluster python3 -m pytest compat_tests/test_kcat.py

With that variable set, every gateway a test starts (``testkit.gateway.
GatewayProcess``: the modules' ``gateway`` fixtures, ``txn_gateway``,
``group_gateway`` and the tests that start their own) runs on the
PostgreSQL store (``--store``) instead of RocksDB in its data directory:

- one throwaway PostgreSQL (``testkit.postgres``) for the whole run,
  started at the first gateway and stopped when the run ends
  (``compat_tests/conftest.py``'s session hook; at exit otherwise, and by
  ``testkit.postgres``'s watchdog if the run is killed);
- one database per data directory: a gateway restarted on the same data
  directory finds its data again, and one started on a new directory starts
  empty, as on RocksDB;
- a gateway that did not start on the PostgreSQL store fails its start
  (``check_started``), so a run can never pass on RocksDB by mistake;
- a gateway started with its own ``--store`` keeps it (and stays alone in
  both modes: the tests that build a cluster by hand start their own).

With ``postgresql-cluster``, every such gateway is also the first of a
cluster of three gateway processes on its database (docs/cluster.md):

- the first keeps the test's arguments and ``--node-id`` (default 0); its
  two siblings get the same arguments with the next two node ids, their own
  data directories beside the first's (``<data>-node<id>``), their own
  ports (chosen at the first start, kept across restarts as the first's
  is) and an ``--admin-listen`` on a free port when the test asked for one;
- the siblings are started, stopped (SIGTERM), killed and restarted with
  the first (``testkit.gateway.GatewayProcess``), so a test's restart is a
  restart of the whole cluster;
- the test's clients bootstrap through the first and follow Metadata to the
  leaders and coordinators, as with a real cluster: partitions and groups
  are spread over the three;
- a start is over when each of the three answers Metadata listing exactly
  the three node ids; otherwise the start fails (``check_cluster``), so a
  run can never pass on one gateway by mistake.

``tests/run_all.sh`` runs a named part of the suite each way
(docs/cluster.md, "Checked with real clients").
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import os
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import asyncpg

from kafka_gateway.client import KafkaClient
from testkit import kafka_requests as rq
from testkit.postgres import PostgresServer

T = TypeVar("T")

ENV = "KAFKA_GATEWAY_TEST_STORE"
MODES = ("postgresql", "postgresql-cluster")
CLUSTER_SIZE = 3
_lock = threading.Lock()
_server: PostgresServer | None = None
_databases: set[str] = set()


def _mode() -> str:
    value = os.environ.get(ENV, "")
    if value not in ("", *MODES):
        raise ValueError(f"{ENV}={value!r}: it takes one of {', '.join(MODES)}")
    return value


def enabled() -> bool:
    """Every gateway on the PostgreSQL store (one gateway or a cluster)."""
    return _mode() in MODES


def cluster_enabled() -> bool:
    """Every gateway the first of a cluster of three."""
    return _mode() == "postgresql-cluster"


def forms_cluster(extra_args: list[str]) -> bool:
    """Whether a gateway with these arguments gets two siblings: in cluster
    mode, unless the test chose its own store."""
    return cluster_enabled() and "--store" not in extra_args


def node_id(extra_args: list[str]) -> int:
    """The ``--node-id`` among a gateway's arguments (the gateway's default: 0)."""
    value = _flag(extra_args, "--node-id")
    return 0 if value is None else int(value)


def sibling_args(extra_args: list[str], node: int) -> list[str]:
    """A sibling's arguments: the first's, with ``node`` as ``--node-id`` and
    any ``--admin-listen`` on a free port of its own."""
    args: list[str] = []
    skip = False
    for index, arg in enumerate(extra_args):
        if skip:
            skip = False
            continue
        name, eq, _ = arg.partition("=")
        if name in ("--node-id", "--admin-listen"):
            skip = not eq
            if name == "--admin-listen":
                args += ["--admin-listen", "127.0.0.1:0"]
            continue
        if name in ("--listen", "--advertise", "--advertised-listeners"):
            # Ports of the first gateway: a sibling cannot share them.
            raise ValueError(f"{ENV}=postgresql-cluster cannot copy {arg} "
                             f"{extra_args[index + 1:index + 2]} to a sibling")
        args.append(arg)
    return [*args, "--node-id", str(node)]


def check_cluster(bootstraps: list[tuple[str, int]], nodes: set[int],
                  timeout: float) -> None:
    """Wait until every gateway of a cluster answers Metadata listing exactly
    ``nodes``; fail loudly with what they said otherwise."""
    async def views() -> list[set[int]]:
        seen = []
        for host, port in bootstraps:
            client = await KafkaClient.connect(host, port)
            try:
                answer = await asyncio.wait_for(client.request(rq.metadata([])), 10)
            finally:
                await client.close()
            seen.append({broker.node_id for broker in answer.brokers})
        return seen

    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            seen = _run(views())
            if all(view == nodes for view in seen):
                return
            last = seen
        except (TimeoutError, OSError) as error:
            last = error
        if time.monotonic() > deadline:
            raise AssertionError(f"{ENV}=postgresql-cluster: the gateways {bootstraps} did "
                                 f"not all list the brokers {sorted(nodes)} in {timeout} s; "
                                 f"last seen: {last!r}")
        time.sleep(0.2)


def _flag(args: list[str], name: str) -> str | None:
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def store_args(data_dir: Path, extra_args: list[str]) -> list[str]:
    """What to add to a gateway's command line: ``--store`` and the URL of
    ``data_dir``'s database, when the variable is set and none is given."""
    if not enabled() or "--store" in extra_args:
        return []
    name = "gw_" + hashlib.sha1(str(data_dir.resolve()).encode()).hexdigest()[:20]
    with _lock:
        server = _started()
        if name not in _databases:
            _run(_create(server.dsn, name))
            _databases.add(name)
    return ["--store", server.dsn_of(name)]


def check_started(output: str, extra_args: list[str]) -> None:
    """Fail loudly if a gateway meant to be on PostgreSQL is not."""
    if enabled() and "PostgreSQL store" not in output:
        raise AssertionError(f"{ENV} is set but the gateway ({extra_args}) did not start on "
                             f"the PostgreSQL store:\n{output[-2000:]}")


def stop() -> None:
    """Stop the run's PostgreSQL (the end of the session)."""
    global _server
    with _lock:
        if _server is not None:
            _server.stop()
            _server = None
            _databases.clear()


def _started() -> PostgresServer:
    global _server
    if _server is None:
        # fsync off: a throwaway cluster; every gateway's guarantee is still
        # PostgreSQL's commit, which is what the tests exercise.
        _server = PostgresServer({"fsync": "off", "max_connections": "300"}).start()
        atexit.register(stop)
    return _server


async def _create(dsn: str, name: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to its end on a loop of its own (the caller may be
    inside a running loop: an async test starting a gateway)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
