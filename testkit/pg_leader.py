"""A gateway reduced to one partition's leader, as a process of its own, for
the fencing test (tests/test_pgstore_fencing.py): the test SIGSTOPs it past its
lease, lets another node take the partition, then SIGCONTs it.

    python -m testkit.pg_leader DSN SCHEMA NODE_ID LOG_ID LEASE_SECONDS TAG

It registers as ``NODE_ID`` (``pgstore.membership``), waits until its
leadership pass (``pgstore.leadership``) gives it partition ``LOG_ID``, opens
the partition's ``pgstore.batch_log`` at that epoch and appends one batch
after another (values ``TAG-<n>``) until an append is refused, printing one
line per event, flushed at once:

    leads <log_id> <epoch>
    appended <n> <base offset> <epoch>
    error <exception type>          (the outcome unknown: the next append rereads)
    lost <Superseded|LeaseExpired>  (its membership; it goes on appending regardless)
    fenced <epoch found>            (then it exits 0)

It goes on appending after its membership is lost on purpose: the test proves
that the fence inside each append's transaction stops it, not its good
manners. It gives up (exit 3) after ``LIMIT_SECONDS``.
"""

from __future__ import annotations

import asyncio
import sys

import asyncpg

from pgstore.batch_log import BatchLog, Fenced
from pgstore.leadership import Leadership
from pgstore.membership import Listener, Membership, MembershipLost, session_settings
from testkit.batches import make_batch

LIMIT_SECONDS = 120.0
PAUSE_SECONDS = 0.01  # between appends


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def lead_and_append(dsn: str, schema: str, node_id: int, log_id: int, lease: float,
                          tag: str) -> int:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4,
                                     server_settings=session_settings(lease))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LIMIT_SECONDS

    def lost(exc: MembershipLost) -> None:
        say(f"lost {type(exc).__name__}")

    membership = Membership(pool, schema, node_id, [Listener("PLAINTEXT", "127.0.0.1", 9092)],
                            lease_seconds=lease, on_lost=lost)
    await membership.start()
    leadership = Leadership(membership)
    try:
        await leadership.start()
        return await _append(pool, schema, leadership, log_id, tag, deadline)
    finally:
        await leadership.stop(give_up=False)
        await membership.halt()
        pool.terminate()


async def _append(pool: asyncpg.Pool, schema: str, leadership: Leadership, log_id: int,
                  tag: str, deadline: float) -> int:
    loop = asyncio.get_running_loop()
    while (epoch := leadership.partition_epoch(log_id)) is None:
        if loop.time() > deadline:
            say("never led")
            return 3
        await asyncio.sleep(0.02)
    log = await BatchLog.open(pool, schema, log_id)
    if log.leader_epoch != epoch:
        say(f"opened at epoch {log.leader_epoch}, led at {epoch}")
        return 3
    say(f"leads {log_id} {epoch}")
    n = 0
    while loop.time() < deadline:
        try:
            (base,) = await log.append([make_batch([f"{tag}-{n}".encode()])])
        except Fenced as fenced:
            say(f"fenced {fenced.leader_epoch}")
            return 0
        except (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError,
                OSError) as exc:
            say(f"error {type(exc).__name__}")
        else:
            say(f"appended {n} {base} {epoch}")
            n += 1
        await asyncio.sleep(PAUSE_SECONDS)
    say("still appending at the time limit")
    return 3


def main(argv: list[str]) -> int:
    dsn, schema, node_id, log_id, lease, tag = argv
    return asyncio.run(lead_and_append(dsn, schema, int(node_id), int(log_id), float(lease),
                                       tag))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
