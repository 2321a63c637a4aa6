"""Differential testing: one scenario, one client, Apache Kafka and the gateway side by side.

    differ = Differ(EXPECTED)
    async with Pair(kafka_broker, gateway, differ) as pair:   # testkit/server_pair.py
        await pair.check("produce/one-record", produce_request)
    differ.verify()

Every response is turned into plain fields (kio entities to dicts, record
batches decoded to their records) and normalised in one place, ``NORMALISE``
below: only values that legitimately differ between two brokers (node ids,
ports, cluster and topic ids, generated member ids, LogAppendTime clocks,
throttle times, the wording of error messages) are replaced by symbols.
Everything else is compared field by field. A difference must be listed in
the tests' table of expected differences (compat_tests/differences.py, each
entry pointing at its reason in docs/compatibility.md, "Differences from
Apache Kafka"); any other fails the test, and so does a listed difference
that no longer happens. Lists whose order carries no meaning are compared
as maps (``KEYED_LISTS``).

``TALLY`` counts scenarios and fields compared over the session; the
compat_tests conftest prints it at the end.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import re
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .batches import decode_batches

ANY: Any = object()  # an expected value that matches whatever is there
ABSENT = "<absent>"  # a field or list element one side has and the other has not
CLOSED = "<connection closed>"  # the server closed the connection instead of answering

_ATTR_LOG_APPEND_TIME = 0x08


def _glob(pattern: str) -> re.Pattern[str]:
    """``*`` matches anything; everything else (brackets included) is literal."""
    return re.compile(".*".join(map(re.escape, pattern.split("*"))))


@dataclass(frozen=True)
class Expected:
    """A known, intended difference: ``path`` is a pattern (``*`` for anything)
    over ``scenario/step:field.path``; values are ANY, a value, or a predicate."""

    path: str
    kafka: Any = ANY
    gateway: Any = ANY
    doc: str = ""  # the entry of docs/compatibility.md, "Differences from Apache Kafka"
    # False for a rule that holds wherever it applies (free text) but need not
    # show in every test that could meet it.
    required: bool = True

    @property
    def step(self) -> str:
        return self.path.split(":", 1)[0]

    def matches(self, diff: Difference) -> bool:
        return (_glob(self.path).fullmatch(diff.path) is not None
                and _value_matches(self.kafka, diff.kafka)
                and _value_matches(self.gateway, diff.gateway))


def _value_matches(expected: Any, actual: Any) -> bool:
    if expected is ANY:
        return True
    if callable(expected):
        return bool(expected(actual))
    return expected == actual


@dataclass(frozen=True)
class Difference:
    path: str
    kafka: Any
    gateway: Any

    def __str__(self) -> str:
        return f"{self.path}: kafka={_short(self.kafka)} gateway={_short(self.gateway)}"


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"...({len(text)} chars)"


@dataclass
class Tally:
    scenarios: set[str] = field(default_factory=set)
    checks: int = 0  # responses (or client outputs) compared
    fields: int = 0
    expected: int = 0  # differences found and accepted as intended

    def summary(self) -> str:
        return (f"differential tests: {len(self.scenarios)} scenarios, {self.checks} responses, "
                f"{self.fields} fields compared between Apache Kafka and the gateway; "
                f"{self.expected} intended differences (docs/compatibility.md)")


TALLY = Tally()


# ------------------------------------------------------------------ normalising
@dataclass
class Server:
    """What is legitimately this server's own: its node id and port, and the
    ids it generates (topic ids, member ids), replaced by symbols in order of
    first appearance so that equal ids still compare equal."""

    name: str
    node_id: int
    port: int
    symbols: dict[tuple[str, str], str] = field(default_factory=dict)
    topic_names: dict[str, str] = field(default_factory=dict)  # topic id -> name

    def symbol(self, kind: str, value: str) -> str:
        key = (kind, value)
        if key not in self.symbols:
            count = sum(1 for k, _ in self.symbols if k == kind)
            self.symbols[key] = f"<{kind} #{count + 1}>"
        return self.symbols[key]


def _node(server: Server, value: Any) -> Any:
    if isinstance(value, list):
        return [_node(server, v) for v in value]
    return "<this node>" if value == server.node_id else value


def _leader(server: Server, value: Any) -> Any:
    # JoinGroup's leader is a member id; elsewhere a node id.
    return _member_id(server, value) if isinstance(value, str) else _node(server, value)


def _message(_server: Server, value: Any) -> Any:
    return None if value in (None, "") else "<message>"


def _topic_id(server: Server, value: Any) -> Any:
    if value is None or value == str(uuid.UUID(int=0)):
        return value
    if value in server.topic_names:
        return f"<id of {server.topic_names[value]}>"
    return server.symbol("topic id", value)


def _resource_name(server: Server, value: Any) -> Any:
    # A broker resource is named by each server's own node id.
    return "<this node>" if value == str(server.node_id) else value


_GENERATED_MEMBER_ID = re.compile(r"(.*)-[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}")


def _member_id(server: Server, value: Any) -> Any:
    # Both coordinators name a member "<instance id or client id>-<random UUID>".
    match = _GENERATED_MEMBER_ID.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return value
    return f"{match[1]}-{server.symbol('member of ' + match[1], value)}"


def _append_time(_server: Server, value: Any) -> Any:
    return "<append time>" if isinstance(value, datetime.datetime) else value


def _port(server: Server, value: Any) -> Any:
    return "<port>" if value == server.port else value


def _records(_server: Server, value: Any) -> Any:
    if not isinstance(value, bytes):
        return value
    batches = decode_batches(bytes(value))
    for batch in batches:
        if batch.get("attributes", 0) & _ATTR_LOG_APPEND_TIME:
            # The broker's clock: differs by nature, and the CRC covers it.
            for key in ("base_timestamp", "max_timestamp", "crc"):
                batch[key] = "<append time>"
    return batches


# The one table of what is normalised, by field name, and why each may differ.
NORMALISE: dict[str, Callable[[Server, Any], Any]] = {
    # each broker's own identity
    "node_id": _node, "leader_id": _node, "controller_id": _node, "replica_nodes": _node,
    "isr_nodes": _node, "offline_replicas": _node, "broker_ids": _node, "broker_id": _node,
    "leader": _leader,
    "port": _port,
    "cluster_id": lambda _s, v: None if v is None else "<cluster id>",
    "topic_id": _topic_id, "resource_name": _resource_name,
    # generated by the group coordinator
    "member_id": _member_id,
    # free text: the code is compared, the wording is each broker's own
    "error_message": _message, "batch_index_error_message": _message,
    # the broker's clock (LogAppendTime)
    "log_append_time": _append_time,
    # record batches: decoded and compared record by record
    "records": _records,
}
# Fields not compared at all: quotas, not semantics.
IGNORED = frozenset({"throttle_time", "throttle_time_ms"})
# Lists whose order carries no meaning (Kafka lists configs, Metadata
# partitions, Produce's topics and partitions, group members in hash order):
# compared as maps keyed by this field, when every item has a distinct one.
KEYED_LISTS = {"configs": "name", "topics": "name", "responses": "name",
               "partition_responses": "index", "partitions": "partition_index",
               "members": "member_id"}


def plain(value: Any, server: Server, key: str | None = None) -> Any:
    """A kio response (or any value) as plain, normalised Python values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        topic_id, name = getattr(value, "topic_id", None), getattr(value, "name", None)
        if topic_id is not None and isinstance(name, str):
            # Ids are each server's own; the topic they name is compared.
            server.topic_names.setdefault(str(topic_id), name)
        return {
            f.name: plain(getattr(value, f.name), server, f.name)
            for f in dataclasses.fields(value) if f.name not in IGNORED
        }
    if isinstance(value, enum.Enum):
        value = value.name
    elif isinstance(value, datetime.timedelta):
        value = int(value.total_seconds() * 1000)
    elif isinstance(value, uuid.UUID):
        value = str(value)
    elif isinstance(value, tuple | list):
        items = [plain(v, server) for v in value]
        keyed = KEYED_LISTS.get(key or "")
        keys = [i.get(keyed) for i in items if isinstance(i, dict) and keyed in i]
        if keyed and len(keys) == len(items) and len(set(keys)) == len(keys):
            value = {str(k): i for k, i in zip(keys, items, strict=True)}
        else:
            value = items
    elif isinstance(value, dict):
        value = {k: plain(v, server, k) for k, v in value.items() if k not in IGNORED}
    elif isinstance(value, bytearray | memoryview):
        value = bytes(value)
    if key in NORMALISE:
        return NORMALISE[key](server, value)
    return value


# ------------------------------------------------------------------ comparing
class Differ:
    """Compares normalised responses and keeps what differed."""

    def __init__(self, expected: Iterable[Expected]) -> None:
        self.expected = list(expected)
        self.used: set[int] = set()
        self.unexpected: list[Difference] = []
        self.accepted: list[Difference] = []
        self.fields = 0
        self.steps: set[str] = set()

    def compare(self, path: str, kafka: Any, gateway: Any) -> list[Difference]:
        """Compare two normalised values; returns the differences found."""
        step = path.split(":", 1)[0]
        self.steps.add(step)
        TALLY.scenarios.add(step.split("/", 1)[0])
        TALLY.checks += 1
        found: list[Difference] = []
        self._walk(path, kafka, gateway, found)
        for diff in found:
            index = next((i for i, e in enumerate(self.expected) if e.matches(diff)), None)
            if index is None:
                self.unexpected.append(diff)
            else:
                self.used.add(index)
                self.accepted.append(diff)
                TALLY.expected += 1
        return found

    def _walk(self, path: str, kafka: Any, gateway: Any, found: list[Difference]) -> None:
        if isinstance(kafka, dict) and isinstance(gateway, dict):
            for key in [*kafka, *(k for k in gateway if k not in kafka)]:
                sub = f"{path}.{key}" if path[-1:] != ":" else f"{path}{key}"
                self._walk(sub, kafka.get(key, ABSENT), gateway.get(key, ABSENT), found)
            return
        if isinstance(kafka, list) and isinstance(gateway, list):
            for i in range(max(len(kafka), len(gateway))):
                self._walk(f"{path}[{i}]",
                           kafka[i] if i < len(kafka) else ABSENT,
                           gateway[i] if i < len(gateway) else ABSENT, found)
            return
        self.fields += 1
        TALLY.fields += 1
        if kafka != gateway:
            found.append(Difference(path, kafka, gateway))

    def verify(self) -> None:
        """Fail on any unexplained difference, and on listed differences of
        the scenarios run here that did not happen (the table must stay true)."""
        problems = [f"unexpected difference: {d}" for d in self.unexpected]
        for i, entry in enumerate(self.expected):
            ran = any(_glob(entry.step).fullmatch(s) for s in self.steps)
            if ran and entry.required and i not in self.used:
                problems.append(f"listed difference no longer happens: {entry.path} "
                                f"(docs/compatibility.md: {entry.doc})")
        assert not problems, (f"{len(problems)} problem(s) after comparing {self.fields} fields "
                              "with Apache Kafka:\n" + "\n".join(problems))
