"""A paused leader that lost its lease writes nothing when it wakes (issue 22:
"A SIGSTOPped leader that lost its lease, then SIGCONTed: none of its writes
land"), with a real process (testkit/pg_leader.py) on a throwaway PostgreSQL:

1. the process registers as node 1, leads the partition, and appends in a loop;
2. the test SIGSTOPs it (and checks the kernel has it stopped: state T in
   /proc/<pid>/stat) and waits until its lease is over by the database's clock;
3. node 2, in this process, takes the partition (its epoch bumped) and appends;
4. the test SIGCONTs the first: its next append is refused (Fenced), and the
   log holds, after the takeover point, only node 2's batches at its epoch.

Every wait is bounded; the process is killed if the test fails.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import asyncpg

from pgstore.batch_log import BatchLog
from pgstore.leadership import Leadership
from pgstore.membership import Listener, Membership, session_settings
from pgstore.migrate import migrate
from tablets import batch as batch_header
from testkit import postgres
from testkit.batches import decode_batches, make_batch
from testkit.postgres import PostgresServer

pg_server = postgres.server_fixture("module")
ROOT = Path(__file__).resolve().parent.parent
LEASE = 1.5
SCHEMA = "fencing"


def proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


class Lines:
    """The process's stdout lines, read by a task as they come."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.lines: list[str] = []
        self._task = asyncio.create_task(self._read(stream))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.lines.append(line.decode().strip())

    async def wait_for(self, what: str, count: int = 1, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while sum(1 for line in self.lines if line.startswith(what)) < count:
            assert time.monotonic() < deadline, (f"not {count} lines {what!r} within "
                                                 f"{within} s: {self.lines[-10:]}")
            assert not self._task.done(), f"the process ended: {self.lines[-10:]}"
            await asyncio.sleep(0.02)

    async def closed(self) -> None:
        await self._task


def test_a_paused_leader_past_its_lease_writes_nothing_when_it_wakes(
        pg_server: PostgresServer) -> None:
    async def body() -> None:
        pool = await asyncpg.create_pool(pg_server.dsn, min_size=1, max_size=6,
                                         server_settings=session_settings(LEASE))
        proc: asyncio.subprocess.Process | None = None
        successor: tuple[Membership, Leadership] | None = None
        try:
            async with pool.acquire() as conn:
                await migrate(conn, SCHEMA)
                topic = uuid.uuid4()
                await conn.execute(f"INSERT INTO {SCHEMA}.topics (topic_id, name, created_ms) "
                                   "VALUES ($1, 'fenced', 0)", topic)
                log_id = int(await conn.fetchval(
                    f"INSERT INTO {SCHEMA}.partitions (topic_id, partition) VALUES ($1, 0) "
                    "RETURNING log_id", topic))
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "testkit.pg_leader", pg_server.dsn, SCHEMA, "1",
                str(log_id), str(LEASE), "old", cwd=ROOT, stdout=asyncio.subprocess.PIPE)
            assert proc.stdout is not None
            out = Lines(proc.stdout)
            await out.wait_for("leads")
            old_epoch = int(out.lines[0].split()[2])
            await out.wait_for("appended", count=20)

            # 1. Stop it, and see that it is stopped.
            os.kill(proc.pid, signal.SIGSTOP)
            deadline = time.monotonic() + 10
            while proc_state(proc.pid) != "T":
                assert time.monotonic() < deadline, f"state {proc_state(proc.pid)}, not T"
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # what it wrote before the stop is read by now
            appended_before = sum(1 for line in out.lines if line.startswith("appended"))
            await asyncio.sleep(0.5)
            assert sum(1 for line in out.lines if line.startswith("appended")) == \
                appended_before, "it still appends while stopped"

            # 2. Its lease runs out, by the database's clock.
            async with pool.acquire() as conn:
                deadline = time.monotonic() + LEASE + 10
                while await conn.fetchval(f"SELECT lease_expires_at > now() FROM {SCHEMA}.nodes "
                                          "WHERE node_id = 1"):
                    assert time.monotonic() < deadline, "node 1's lease never ran out"
                    await asyncio.sleep(0.05)
            assert proc_state(proc.pid) == "T"  # still stopped: it could not have renewed

            # 3. Node 2 takes the partition over (a row the paused process may
            # hold locked is freed by idle_in_transaction_session_timeout).
            membership = Membership(pool, SCHEMA, 2, [Listener("PLAINTEXT", "127.0.0.1", 9093)],
                                    lease_seconds=LEASE)
            await membership.start()
            leadership = Leadership(membership)
            successor = (membership, leadership)
            await leadership.start()
            deadline = time.monotonic() + 3 * LEASE + 10
            while leadership.partition_epoch(log_id) is None:
                assert time.monotonic() < deadline, "node 2 never took the partition"
                await leadership.run_pass()
                await asyncio.sleep(0.05)
            new_epoch = leadership.partition_epoch(log_id)
            assert new_epoch is not None and new_epoch > old_epoch
            log = await BatchLog.open(pool, SCHEMA, log_id)
            assert log.leader_epoch == new_epoch
            takeover = log.log_end_offset
            assert takeover >= appended_before  # one record per batch
            for n in range(5):
                await log.append([make_batch([f"new-{n}".encode()])])
            assert proc_state(proc.pid) == "T"  # the fault was there all along

            # 4. Wake it: its next append is refused.
            os.kill(proc.pid, signal.SIGCONT)
            await out.wait_for("fenced", within=30)
            assert await asyncio.wait_for(proc.wait(), timeout=30) == 0
            await out.closed()
            fenced = [line for line in out.lines if line.startswith("fenced")]
            assert fenced == [f"fenced {new_epoch}"], out.lines[-10:]
            # Nothing appended after that (a "lost" line from its renewal may come in any order).
            after_fence = out.lines[out.lines.index(fenced[0]):]
            assert not [line for line in after_fence if line.startswith(("appended", "error"))]
            # Whatever it says it appended landed before the takeover.
            bases = [int(line.split()[2]) for line in out.lines if line.startswith("appended")]
            assert bases and max(bases) < takeover, (max(bases), takeover)

            # The log: the old leader's batches, then only the new leader's.
            stored = await log.read(0, 1 << 24)
            assert batch_header.base_offset_of(stored[-1]) == takeover + 4
            before = [b for b in stored if batch_header.base_offset_of(b) < takeover]
            after = [b for b in stored if batch_header.base_offset_of(b) >= takeover]

            def epochs(batches: list[bytes]) -> set[int]:
                return {int.from_bytes(b[12:16], "big", signed=True) for b in batches}

            def values(batches: list[bytes]) -> list[bytes]:
                return [r["value"] for d in decode_batches(b"".join(batches))
                        for r in d["records"]]

            assert epochs(before) == {old_epoch}
            assert values(before) == [f"old-{n}".encode() for n in range(len(before))]
            assert len(before) >= len(bases)  # every append it reported, and maybe one unreported
            assert epochs(after) == {new_epoch}
            assert values(after) == [f"new-{n}".encode() for n in range(5)]
            print(f"fenced: the paused leader appended {len(before)} batches at epoch "
                  f"{old_epoch}; after the takeover at offset {takeover} (epoch {new_epoch}) "
                  f"none of its appends landed; its output ended {out.lines[-3:]}")
        finally:
            if successor is not None:
                await successor[1].stop()
                await successor[0].stop()
            if proc is not None and proc.returncode is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                await proc.wait()
            await pool.close()

    asyncio.run(asyncio.wait_for(body(), timeout=120))

