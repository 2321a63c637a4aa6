"""The compatibility suite on the PostgreSQL store.

    KAFKA_GATEWAY_TEST_STORE=postgresql python3 -m pytest compat_tests/test_txn_confluent.py

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
- a gateway started with its own ``--store`` keeps it.

``tests/run_all.sh`` runs a named part of the suite this way
(docs/cluster.md, "Checked with real clients").
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncpg

from testkit.postgres import PostgresServer

ENV = "KAFKA_GATEWAY_TEST_STORE"
_lock = threading.Lock()
_server: PostgresServer | None = None
_databases: set[str] = set()


def enabled() -> bool:
    value = os.environ.get(ENV, "")
    if value not in ("", "postgresql"):
        raise ValueError(f"{ENV}={value!r}: the only store it takes is 'postgresql'")
    return value == "postgresql"


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


def _run(coroutine: object) -> None:
    """Run ``coroutine`` to its end on a loop of its own (the caller may be
    inside a running loop: an async test starting a gateway)."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, coroutine).result()  # type: ignore[arg-type]
