"""Connecting to the server of a (multi-host) URL that takes writes, each host
within its own time limit.

    conn = await connect("postgresql://u@pg1:5432,pg2:5432/kafka"
                         "?target_session_attrs=read-write")

asyncpg (0.32) takes libpq's multi-host URL and ``target_session_attrs``, and
tries the hosts in order; but its ``timeout`` bounds the whole attempt, not
each host. A host that hangs (its machine gone silent, a network dropping
its packets, a frozen server: the TCP handshake may even complete, and
nothing answers) uses all of it, so the hosts after it are never tried and
a promoted standby is never reached (tested: ``tests/test_pgstore_failover.py``).
libpq's ``connect_timeout`` is per host; this is the same rule for asyncpg:
a multi-host URL is split into one URL per host (same user, database and
parameters), and each is tried with ``asyncpg.connect`` within
``host_timeout`` seconds, in order. The first that connects and matches
``target_session_attrs`` is returned; when none does, the last error is
raised. A single-host URL is one attempt within ``host_timeout``.

The writer (``PgWriter``) and the listener (``LogNotices``) connect through
it by default; a pool takes it as ``asyncpg.create_pool(dsn, connect=connect)``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

# Per host. A connection on loopback or a LAN takes milliseconds; libpq's
# documentation advises at least 2 s for connect_timeout.
HOST_TIMEOUT_SECONDS = 3.0

# What a host that cannot be used raises: then the next one is tried.
_HOST_ERRORS: tuple[type[BaseException], ...] = (
    OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError,
    asyncpg.InternalClientError,  # TargetServerAttributeNotMatched: a standby
)


def per_host(dsn: str) -> list[str]:
    """One URL per host of ``dsn`` (``dsn`` itself when it names one host, or
    is not a URL)."""
    scheme, sep, rest = dsn.partition("://")
    if not sep:
        return [dsn]
    at = rest.rfind("@", 0, _end_of_netloc(rest))
    userinfo, hosts = rest[:at + 1], rest[at + 1:]
    end = _end_of_netloc(hosts)
    hostlist, tail = hosts[:end], hosts[end:]
    if "," not in hostlist:
        return [dsn]
    return [f"{scheme}://{userinfo}{host}{tail}" for host in hostlist.split(",") if host]


def _end_of_netloc(rest: str) -> int:
    ends = [i for i in (rest.find("/"), rest.find("?")) if i != -1]
    return min(ends) if ends else len(rest)


async def connect(dsn: str, *, host_timeout: float = HOST_TIMEOUT_SECONDS,
                  **kwargs: Any) -> asyncpg.Connection:
    """A connection to the first host of ``dsn`` that connects within
    ``host_timeout`` and matches its ``target_session_attrs``; ``kwargs`` go
    to ``asyncpg.connect`` (a pool passes its own)."""
    last: BaseException | None = None
    for one in per_host(dsn):
        try:
            conn: asyncpg.Connection = await asyncio.wait_for(
                asyncpg.connect(one, **kwargs), host_timeout)
        except _HOST_ERRORS as exc:
            last = exc
            continue
        return conn
    assert last is not None
    raise last
