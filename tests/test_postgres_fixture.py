"""testkit/postgres.py: a throwaway PostgreSQL server that never outlives its test.

- it starts (initdb, pg_ctl start), answers SQL on 127.0.0.1 at its port, runs
  as the ``postgres`` user when we are root, and is the installed version;
- leaving the ``with`` stops it: the postmaster is gone, the port closed, the
  directory deleted; also when the body raised;
- the pytest fixture stops it when its scope ends, a failing test included (a
  pytest run in a subprocess, on a test module written here);
- the watchdog stops it when the process that started it is killed with
  SIGKILL (no ``finally`` runs there).
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from testkit import postgres
from testkit.postgres import PostgresServer, alive, port_open

ROOT = Path(__file__).resolve().parent.parent

pg_server = postgres.server_fixture("module")


def _wait_gone(pid: int, port: int, root: Path, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while alive(pid) or port_open(port) or root.exists():
        assert time.monotonic() < deadline, (
            f"still there after {within}s: pid {pid} alive={alive(pid)}, "
            f"port {port} open={port_open(port)}, {root} exists={root.exists()}")
        time.sleep(0.1)


def test_the_server_answers_sql_as_the_installed_version(pg_server: PostgresServer) -> None:
    async def ask() -> tuple[str, str, str]:
        conn = await asyncpg.connect(pg_server.dsn)
        try:
            return (await conn.fetchval("SHOW server_version_num"),
                    await conn.fetchval("SHOW listen_addresses"),
                    await conn.fetchval("SELECT current_user"))
        finally:
            await conn.close()

    version_num, listen, user = asyncio.run(ask())
    assert int(version_num) // 10000 == postgres.version()
    assert str(postgres.bin_dir()).startswith(("/usr/lib/postgresql/",
                                               os.environ.get("KAFKA_GATEWAY_PG_BIN", "-")))
    assert listen == "127.0.0.1"
    assert user == "postgres"
    pid = pg_server.pid
    assert pid is not None and alive(pid)
    owner = os.stat(f"/proc/{pid}").st_uid
    expected = pwd.getpwnam("postgres").pw_uid if os.geteuid() == 0 else os.geteuid()
    assert owner == expected


def test_leaving_the_with_stops_the_server_and_deletes_its_directory() -> None:
    with PostgresServer() as pg:
        pid, port, root = pg.pid, pg.port, pg.root
        assert pid is not None and root is not None
        assert alive(pid) and port_open(port) and root.exists()  # the premise
    assert not alive(pid)
    assert not port_open(port)
    assert not root.exists()


def test_a_body_that_raises_still_stops_the_server() -> None:
    server = PostgresServer()
    with pytest.raises(RuntimeError, match="the test failed"), server:
        pid, port, root = server.pid, server.port, server.root
        assert pid is not None and root is not None and alive(pid)
        raise RuntimeError("the test failed")
    assert not alive(pid)
    assert not port_open(port)
    assert not root.exists()
    server.stop()  # a second stop is harmless


_FAILING_MODULE = """
import json
from pathlib import Path
from testkit import postgres

pg = postgres.server_fixture("module")

def test_fails(pg):
    Path({record!r}).write_text(json.dumps(
        {{"pid": pg.pid, "port": pg.port, "root": str(pg.root)}}))
    assert False, "this test fails on purpose"
"""


def test_the_fixture_stops_the_server_after_a_failing_test(tmp_path: Path) -> None:
    record = tmp_path / "server.json"
    module = tmp_path / "test_fails_on_purpose.py"
    module.write_text(_FAILING_MODULE.format(record=str(record)))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(module)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=240)
    assert run.returncode == 1, run.stdout + run.stderr  # the test ran, and failed
    assert "this test fails on purpose" in run.stdout
    seen = json.loads(record.read_text())
    # pytest has returned: the fixture's teardown ran before it did.
    assert not alive(seen["pid"])
    assert not port_open(seen["port"])
    assert not Path(seen["root"]).exists()


_KILLED = """
import json, os, signal, sys
from testkit.postgres import PostgresServer
pg = PostgresServer().start()
print(json.dumps({"pid": pg.pid, "port": pg.port, "root": str(pg.root)}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_watchdog_stops_the_server_of_a_killed_process() -> None:
    run = subprocess.run([sys.executable, "-c", _KILLED],
                         env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == -9, run.stdout + run.stderr  # killed: no finally ran
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["pid"] > 0
    _wait_gone(seen["pid"], seen["port"], Path(seen["root"]))
