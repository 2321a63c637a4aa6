"""Bring a database's schema to this code's version, at start-up.

    result = await migrate(conn)            # the DEFAULT_SCHEMA namespace
    result = await migrate(conn, "tenant7")

One PostgreSQL transaction does it all, so a migration lands whole or not at
all (PostgreSQL's DDL is transactional):

1. take a transaction-scoped advisory lock named after the schema: of the
   gateways starting at once, one migrates; the others wait for it (at most
   ``wait_seconds``, then ``MigrationError``) and then find nothing to do;
2. create the schema and its ``schema_migrations`` table if absent;
3. read the version: the highest recorded migration (0: empty);
4. refuse a version newer than this code knows (``SchemaTooNew``): a newer
   gateway migrated this database, and an older one must not write into
   tables it does not understand;
5. apply each missing migration in order, recording each.

The role needs CREATE on the database (for the schema) the first time, and
ownership of the schema's tables for later migrations.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from .schema import DEFAULT_SCHEMA, MIGRATIONS, Migration

# The advisory lock's first key: "kgw" in ASCII, so it is recognisable in
# pg_locks; the second is hashtext(schema).
LOCK_CLASS = 0x6B6777
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# A connection of its own or one lent by a pool.
Connection = asyncpg.Connection | PoolConnectionProxy


class MigrationError(RuntimeError):
    """The schema could not be brought to this code's version."""


class SchemaTooNew(MigrationError):
    """The database's schema is newer than this code: upgrade the gateway."""


@dataclass(frozen=True, slots=True)
class MigrationResult:
    schema: str
    before: int  # the version found
    after: int  # the version now
    applied: tuple[int, ...]  # the migrations this call applied (none: another had)


def quoted(schema: str) -> str:
    """The schema's name as an SQL identifier; only plain lower-case names
    are accepted, so the name is the same quoted or not."""
    if not _IDENTIFIER.fullmatch(schema):
        raise ValueError(f"schema name {schema!r}: use lower-case letters, digits and _ "
                         "(at most 63, not starting with a digit)")
    return f'"{schema}"'


def _check_sequence(migrations: Sequence[Migration]) -> None:
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migrations must be numbered 1, 2, 3...: {versions}")


async def schema_version(conn: Connection, schema: str = DEFAULT_SCHEMA) -> int:
    """The schema's version (0: no schema, or an empty one), without changing anything."""
    name = quoted(schema)
    exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL",
                                 f"{name}.schema_migrations")
    if not exists:
        return 0
    return int(await conn.fetchval(
        f"SELECT coalesce(max(version), 0) FROM {name}.schema_migrations"))


async def migrate(conn: Connection, schema: str = DEFAULT_SCHEMA,
                  migrations: Sequence[Migration] = MIGRATIONS,
                  wait_seconds: float = 120.0) -> MigrationResult:
    """Bring ``schema`` to the last of ``migrations`` (see the module's docstring)."""
    _check_sequence(migrations)
    name = quoted(schema)
    latest = migrations[-1].version if migrations else 0
    async with conn.transaction():
        # A lock wait longer than this fails the statement (and the transaction).
        await conn.execute(f"SET LOCAL lock_timeout = '{int(wait_seconds * 1000)}ms'")
        try:
            await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))",
                               LOCK_CLASS, schema)
        except asyncpg.LockNotAvailableError as exc:
            raise MigrationError(
                f"schema {schema}: another gateway has been migrating it for more than "
                f"{wait_seconds:g} s (its session holds advisory lock ({LOCK_CLASS}, "
                f"hashtext('{schema}')); see pg_locks)") from exc
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {name}")
        await conn.execute(
            f"""CREATE TABLE IF NOT EXISTS {name}.schema_migrations (
                version integer PRIMARY KEY,
                description text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )""")
        before = int(await conn.fetchval(
            f"SELECT coalesce(max(version), 0) FROM {name}.schema_migrations"))
        if before > latest:
            raise SchemaTooNew(
                f"schema {schema} is at version {before}, newer than this gateway's "
                f"{latest}: a newer gateway migrated it; upgrade this one (an older "
                "gateway must not write to tables it does not know)")
        applied = []
        for migration in migrations:
            if migration.version <= before:
                continue
            for statement in migration.statements:
                await conn.execute(statement.replace("{schema}", name))
            await conn.execute(
                f"INSERT INTO {name}.schema_migrations (version, description) VALUES ($1, $2)",
                migration.version, migration.description)
            applied.append(migration.version)
    return MigrationResult(schema, before, max(before, latest), tuple(applied))
