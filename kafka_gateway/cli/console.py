"""``kafka-gateway produce`` and ``consume``: the console producer and consumer,
like ``kafka-console-producer.sh`` and ``kafka-console-consumer.sh`` (same flag
and property names), on librdkafka (confluent-kafka).

produce: one record per line of standard input. ``--property parse.key=true``
splits each line at ``key.separator`` (default a tab) into key and value;
``--property parse.headers=true`` first takes the headers off the front of the
line, up to ``headers.delimiter`` (tab): ``k1:v1,k2:v2``. A key, value or
header value equal to ``null.marker`` (if set) is null.

consume: prints each record's value on a line, with its timestamp, partition,
offset, headers and key before it when ``--property print.timestamp=true``
etc. ask (Kafka's DefaultMessageFormatter), or as ``--format`` says (kcat's
tokens). Without ``--group`` it reads the partitions directly (no group is
created); with one it subscribes, shares partitions with the group's other
members and commits what it printed.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable

from common.key_value import parse_pairs

from .common import DEFAULT_BOOTSTRAP, add_client_options, bootstrap_servers, client_properties

PRODUCER_PROPERTIES = {
    "parse.key": "false", "key.separator": "\t", "parse.headers": "false",
    "headers.delimiter": "\t", "headers.separator": ",", "headers.key.separator": ":",
    "null.marker": "", "ignore.error": "false",
}
CONSUMER_PROPERTIES = {
    "print.timestamp": "false", "print.partition": "false", "print.offset": "false",
    "print.headers": "false", "print.key": "false", "print.value": "true",
    "key.separator": "\t", "line.separator": "\n", "headers.separator": ",",
    "headers.key.separator": ":", "null.literal": "null",
}
_ESCAPES = {"\\n": "\n", "\\t": "\t", "\\r": "\r", "\\\\": "\\"}


def add_console_parsers(commands: argparse._SubParsersAction) -> None:
    produce = commands.add_parser(
        "produce", help="write lines of standard input to a topic (console producer)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_client_options(produce)
    produce.add_argument("--topic", required=True, help="the topic to write to")
    produce.add_argument("--partition", type=int, default=None,
                         help="write every record to this partition (default: the key's "
                              "partition, murmur2 as Java clients, or spread when no key)")
    produce.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                         help="how lines are read: " + _listing(PRODUCER_PROPERTIES))
    produce.add_argument("--producer-property", action="append", default=[], metavar="KEY=VALUE",
                         help="a librdkafka producer setting, e.g. linger.ms=5 or "
                              "enable.idempotence=true")
    produce.add_argument("--request-required-acks", default=None,
                         choices=("-1", "0", "1", "all"),
                         help="acks: -1/all waits for the write to the store (default -1) [acks]")
    produce.add_argument("--compression-codec", default=None,
                         choices=("none", "gzip", "snappy", "lz4", "zstd"),
                         help="compress batches (default none) [compression.type]")

    consume = commands.add_parser(
        "consume", help="print the records of a topic (console consumer)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_client_options(consume)
    consume.add_argument("--topic", required=True, help="the topic to read")
    consume.add_argument("--group", default=None,
                         help="consume as a member of this group, committing what is printed "
                              "(default: no group, every partition read directly) [group.id]")
    consume.add_argument("--from-beginning", action="store_true",
                         help="start at the log start offset (with --group: only if the group "
                              "has no committed offset) (default: new records only) "
                              "[auto.offset.reset=earliest]")
    consume.add_argument("--partition", type=int, default=None,
                         help="read only this partition (no --group)")
    consume.add_argument("--offset", default=None,
                         help="with --partition: earliest, latest or an offset to start at "
                              "(default latest, or earliest with --from-beginning)")
    consume.add_argument("--max-messages", type=int, default=None,
                         help="exit after this many records (default: run until interrupted)")
    consume.add_argument("--timeout-ms", type=int, default=None,
                         help="exit when no record arrives for this long (default: wait)")
    consume.add_argument("--isolation-level", default="read_uncommitted",
                         choices=("read_uncommitted", "read_committed"),
                         help="read_committed skips aborted transactions (default "
                              "read_uncommitted) [isolation.level]")
    consume.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                         help="what is printed: " + _listing(CONSUMER_PROPERTIES))
    consume.add_argument("--format", default=None, metavar="FMT",
                         help="print each record as FMT instead (kcat's tokens): %%t topic, "
                              "%%p partition, %%o offset, %%T timestamp, %%k key, %%s value, "
                              "%%h headers, %%K key length, %%S value length; \\n \\t escapes")
    consume.add_argument("--consumer-property", action="append", default=[],
                         metavar="KEY=VALUE", help="a librdkafka consumer setting")


def _listing(defaults: dict[str, str]) -> str:
    return ", ".join(f"{k} (default {v!r})" for k, v in defaults.items())


def _properties(items: list[str], defaults: dict[str, str]) -> dict[str, str]:
    given = parse_pairs(items, "kafka-gateway: --property")
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise SystemExit(f"kafka-gateway: unknown --property {', '.join(unknown)} "
                         f"(known: {', '.join(defaults)})")
    return {**defaults, **{k: _unescape(v) for k, v in given.items()}}


def _unescape(text: str) -> str:
    for escaped, plain in _ESCAPES.items():
        text = text.replace(escaped, plain)
    return text


def _servers(args: argparse.Namespace) -> str:
    return ",".join(f"{h}:{p}" for h, p in bootstrap_servers(args)) or DEFAULT_BOOTSTRAP


# ------------------------------------------------------------------ produce
Header = tuple[str, bytes | None]


class LineReader:
    """One line of input into (key, value, headers), as Kafka's LineMessageReader."""

    def __init__(self, properties: dict[str, str]) -> None:
        self.parse_key = properties["parse.key"].lower() == "true"
        self.parse_headers = properties["parse.headers"].lower() == "true"
        self.ignore_error = properties["ignore.error"].lower() == "true"
        self.key_separator = properties["key.separator"]
        self.headers_delimiter = properties["headers.delimiter"]
        self.headers_separator = properties["headers.separator"]
        self.header_key_separator = properties["headers.key.separator"]
        self.null_marker = properties["null.marker"] or None

    def _value(self, text: str) -> bytes | None:
        return None if text == self.null_marker else text.encode()

    def read(self, line: str, number: int) -> tuple[bytes | None, bytes | None, list[Header]]:
        headers: list[Header] = []
        if self.parse_headers:
            head, sep, line = line.partition(self.headers_delimiter)
            if not sep:
                if not self.ignore_error:
                    raise ValueError(f"no headers delimiter on line {number}")
                line = head
            else:
                for item in filter(None, head.split(self.headers_separator)):
                    name, sep, value = item.partition(self.header_key_separator)
                    if not sep:
                        raise ValueError(f"header {item!r} on line {number} has no "
                                         f"{self.header_key_separator!r}")
                    headers.append((name, self._value(value)))
        key = None
        if self.parse_key:
            key_text, sep, rest = line.partition(self.key_separator)
            if sep:
                key, line = self._value(key_text), rest
            elif not self.ignore_error:
                raise ValueError(f"no key separator on line {number}")
        return key, self._value(line), headers


def run_produce(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException, Producer

    reader = LineReader(_properties(args.property, PRODUCER_PROPERTIES))
    given = {"acks": args.request_required_acks, "compression.type": args.compression_codec}
    settings = {
        "acks": "-1", "compression.type": "none",
        # Keys land where Kafka's own console producer puts them.
        "partitioner": "murmur2_random",
        **client_properties(args),
        **{k: ("-1" if v == "all" else v) for k, v in given.items() if v is not None},
        **parse_pairs(args.producer_property, "kafka-gateway: --producer-property"),
        "bootstrap.servers": _servers(args),
    }
    failures: list[str] = []

    def delivered(error, message) -> None:
        if error is not None:
            failures.append(f"{message.topic()}-{message.partition()}: {error.str()}")

    producer = Producer(settings)
    extra = {} if args.partition is None else {"partition": args.partition}
    try:
        for number, raw in enumerate(sys.stdin, 1):
            line = raw.removesuffix("\n").removesuffix("\r")
            try:
                key, value, headers = reader.read(line, number)
            except ValueError as exc:
                raise SystemExit(f"kafka-gateway: {exc}") from None
            while True:
                try:
                    producer.produce(args.topic, value=value, key=key, headers=headers or None,
                                     on_delivery=delivered, **extra)
                    break
                except BufferError:  # the local queue is full: let it drain
                    producer.poll(0.1)
            producer.poll(0)
    except KafkaException as exc:
        raise SystemExit(f"kafka-gateway: {exc}") from None
    finally:
        remaining = producer.flush(30)
    if remaining:
        failures.append(f"{remaining} records were not acknowledged within 30 s")
    for failure in failures:
        print(f"Error: {failure}", file=sys.stderr)
    return 1 if failures else 0


# ------------------------------------------------------------------ consume
def record_formatter(properties: dict[str, str], template: str | None) -> Callable[..., bytes]:
    """The bytes printed for one message (a confluent_kafka Message)."""
    if template is not None:
        return _template_formatter(_unescape(template))
    show = {k: properties[k].lower() == "true" for k in properties if k.startswith("print.")}
    separator = properties["key.separator"].encode()
    end = properties["line.separator"].encode()
    null = properties["null.literal"].encode()
    header_separator = properties["headers.separator"].encode()
    header_key_separator = properties["headers.key.separator"].encode()

    def format_message(message) -> bytes:
        parts = []
        if show["print.timestamp"]:
            kind, stamp = message.timestamp()
            parts.append(f"{_TIMESTAMP_TYPES.get(kind, 'NO_TIMESTAMP')}:{stamp}".encode())
        if show["print.partition"]:
            parts.append(f"Partition:{message.partition()}".encode())
        if show["print.offset"]:
            parts.append(f"Offset:{message.offset()}".encode())
        if show["print.headers"]:
            headers = message.headers() or []
            parts.append(header_separator.join(
                name.encode() + header_key_separator + (null if value is None else value)
                for name, value in headers) or b"NO_HEADERS")
        if show["print.key"]:
            parts.append(null if message.key() is None else message.key())
        if show["print.value"]:
            parts.append(null if message.value() is None else message.value())
        return separator.join(parts) + end

    return format_message


_TIMESTAMP_TYPES = {1: "CreateTime", 2: "LogAppendTime"}


def _template_formatter(template: str) -> Callable[..., bytes]:
    tokens: dict[str, Callable[..., bytes]] = {
        "t": lambda m: m.topic().encode(),
        "p": lambda m: str(m.partition()).encode(),
        "o": lambda m: str(m.offset()).encode(),
        "T": lambda m: str(m.timestamp()[1]).encode(),
        "k": lambda m: m.key() or b"",
        "s": lambda m: m.value() or b"",
        "K": lambda m: str(-1 if m.key() is None else len(m.key())).encode(),
        "S": lambda m: str(-1 if m.value() is None else len(m.value())).encode(),
        "h": lambda m: b",".join(k.encode() + b"=" + (v or b"") for k, v in m.headers() or []),
        "%": lambda m: b"%",
    }
    pieces: list[bytes | Callable[..., bytes]] = []
    literal = ""
    chars = iter(template)
    for char in chars:
        if char != "%":
            literal += char
            continue
        token = next(chars, "")
        if token not in tokens:
            raise SystemExit(f"kafka-gateway: --format: unknown token %{token}")
        pieces.append(literal.encode())
        literal = ""
        pieces.append(tokens[token])
    pieces.append(literal.encode())

    def format_message(message) -> bytes:
        return b"".join(p if isinstance(p, bytes) else p(message) for p in pieces)

    return format_message


def run_consume(args: argparse.Namespace) -> int:
    from confluent_kafka import (
        OFFSET_BEGINNING,
        OFFSET_END,
        Consumer,
        KafkaException,
        TopicPartition,
    )

    formatter = record_formatter(_properties(args.property, CONSUMER_PROPERTIES), args.format)
    if args.group is not None and (args.partition is not None or args.offset is not None):
        raise SystemExit("kafka-gateway: --partition and --offset read without a --group")
    if args.offset is not None and args.partition is None:
        raise SystemExit("kafka-gateway: --offset needs --partition")
    settings = {
        **client_properties(args),
        "bootstrap.servers": _servers(args),
        # Without --group no group is joined and nothing is committed; librdkafka
        # wants an id all the same.
        "group.id": args.group or "kafka-gateway-console",
        "enable.auto.commit": args.group is not None,
        "auto.offset.reset": "earliest" if args.from_beginning else "latest",
        "isolation.level": args.isolation_level,
        "enable.partition.eof": False,
        **parse_pairs(args.consumer_property, "kafka-gateway: --consumer-property"),
    }
    start = OFFSET_BEGINNING if args.from_beginning else OFFSET_END
    if args.offset is not None:
        start = {"earliest": OFFSET_BEGINNING, "latest": OFFSET_END}.get(args.offset)
        if start is None:
            try:
                start = int(args.offset)
            except ValueError:
                raise SystemExit(f"kafka-gateway: --offset: expected earliest, latest or a "
                                 f"number, got {args.offset!r}") from None
    consumer = Consumer(settings)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    out = sys.stdout.buffer
    count = 0
    try:
        if args.group is not None:
            consumer.subscribe([args.topic])
        else:
            described = consumer.list_topics(args.topic, timeout=30).topics[args.topic]
            if described.error is not None:
                raise SystemExit(f"kafka-gateway: topic {args.topic}: {described.error.str()}")
            partitions = ([args.partition] if args.partition is not None
                          else sorted(described.partitions))
            consumer.assign([TopicPartition(args.topic, p, start) for p in partitions])
        last = time.monotonic()
        while not stopping and (args.max_messages is None or count < args.max_messages):
            message = consumer.poll(0.2)
            if message is None:
                if args.timeout_ms is not None and \
                        (time.monotonic() - last) * 1000 >= args.timeout_ms:
                    break
                continue
            if message.error() is not None:
                if message.error().fatal() or not message.error().retriable():
                    raise KafkaException(message.error())
                continue
            out.write(formatter(message))
            out.flush()
            count += 1
            last = time.monotonic()
    except KafkaException as exc:
        raise SystemExit(f"kafka-gateway: {exc}") from None
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()  # with a group: commits what was printed, and leaves
        print(f"Processed a total of {count} messages", file=sys.stderr)
    return 0
