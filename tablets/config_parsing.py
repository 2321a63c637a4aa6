"""Config values parsed exactly as Kafka's ConfigDef parses them (Java semantics).

Kafka trims a value with Java's ``String.trim`` (every char up to U+0020, not
Unicode spaces), then parses it with ``Integer.parseInt``, ``Long.parseLong``,
``Double.parseDouble``, or splits a list on commas. Python's own parsers are
more lenient (``1_000``, ``nan``, ``inf``, Unicode spaces, digits outside the
BMP) and stricter (``0.5d``, hex floats): each rule below follows Java, and the
differential tests check them against a live Apache Kafka 3.4.1.

A parsed value is shown back as Kafka shows it (``ConfigDef.convertToString``):
``+0100`` is ``100``, ``1`` as a double is ``1.0``, a list is joined with ``,``.
"""

from __future__ import annotations

import decimal
import math
import re
import unicodedata


class ParseError(ValueError):
    """Not a value of the config's type."""


def java_trim(value: str) -> str:
    """``String.trim``: strips code points up to U+0020 at both ends, nothing else."""
    start, end = 0, len(value)
    while start < end and value[start] <= " ":
        start += 1
    while end > start and value[end - 1] <= " ":
        end -= 1
    return value[start:end]


def _digit(char: str) -> int:
    # Character.digit(char, 10): a decimal digit of any script, but one UTF-16
    # unit only (parseInt walks chars, so digits outside the BMP are not digits).
    if ord(char) > 0xFFFF:
        return -1
    return unicodedata.decimal(char, -1)


def parse_integer(text: str, bits: int) -> int:
    """``Integer.parseInt`` (32), ``Long.parseLong`` (64), ``Short.parseShort`` (16)."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body:
        raise ParseError(text)
    value = 0
    for char in body:
        digit = _digit(char)
        if digit < 0:
            raise ParseError(text)
        value = value * 10 + digit
    if text[:1] == "-":
        value = -value
    if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise ParseError(text)
    return value


# Double.parseDouble's grammar (the regex its Javadoc gives), ASCII digits only.
_DOUBLE = re.compile(
    r"[+-]?(?:NaN|Infinity"
    r"|(?P<dec>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?"
    r"|(?P<hex>0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?[0-9]+)[fFdD]?)",
    re.ASCII,
)


def parse_double(text: str) -> float:
    match = _DOUBLE.fullmatch(text)
    if match is None:
        raise ParseError(text)
    negative = text.startswith("-")
    if match["dec"] is not None:
        value = float(match["dec"])
    elif match["hex"] is not None:
        value = float.fromhex(match["hex"])
    else:
        value = math.nan if "NaN" in text else math.inf
    return -value if negative else value


def java_double_string(value: float) -> str:
    """``Double.toString``: plain between 10^-3 and 10^7, else ``d.dddE±n``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    if 1e-3 <= abs(value) < 1e7:
        return repr(value)  # shortest digits, always with a fractional part here
    sign, digits, exponent = decimal.Decimal(repr(value)).as_tuple()
    text = "".join(map(str, digits)).rstrip("0") or "0"
    assert isinstance(exponent, int)
    power = exponent + len(digits) - 1
    return f"{'-' if sign else ''}{text[0]}.{text[1:] or '0'}E{power}"


def equals_ignore_case(a: str, b: str) -> bool:
    """``String.equalsIgnoreCase``: char by char, upper or lower case equal."""
    return len(a) == len(b) and all(
        x == y or x.upper() == y.upper() or x.lower() == y.lower()
        for x, y in zip(a, b, strict=True))


_JAVA_SPACE = "[ \t\n\x0b\f\r]"
_LIST_SEPARATOR = re.compile(f"{_JAVA_SPACE}*,{_JAVA_SPACE}*")


def parse_list(text: str) -> list[str]:
    """A LIST value: comma separated, blanks around commas dropped, empty items kept."""
    return [] if not text else _LIST_SEPARATOR.split(text)


# ------------------------------------------------------- Kafka's special validators
# message.format.version takes a Kafka release as MetadataVersion names them
# (3.4's list: IBP_0_8_0 .. IBP_3_4_IV0): "X.Y-IVn", or the release alone.
_RELEASES = {
    "0.8.0": 0, "0.8.1": 0, "0.8.2": 0, "0.9.0": 0, "0.10.0": 2, "0.10.1": 3, "0.10.2": 1,
    "0.11.0": 3, "1.0": 1, "1.1": 1, "2.0": 2, "2.1": 3, "2.2": 2, "2.3": 2, "2.4": 2,
    "2.5": 1, "2.6": 1, "2.7": 3, "2.8": 2, "3.0": 2, "3.1": 1, "3.2": 1, "3.3": 4, "3.4": 1,
}  # release -> number of internal versions (0: the release has none)
METADATA_VERSIONS = frozenset(
    {*_RELEASES, *(f"{r}-IV{i}" for r, n in _RELEASES.items() for i in range(n))})


def is_metadata_version(text: str) -> bool:
    """MetadataVersion.fromVersionString: ``0.x.y`` keeps three parts, later
    releases two (``3.4.1`` is ``3.4``); Java's split drops trailing empties."""
    parts = text.split(".")
    while parts and parts[-1] == "":
        parts.pop()
    keep = 3 if text.startswith("0.") else 2
    key = text if keep >= len(parts) else ".".join(parts[:keep])
    return key in METADATA_VERSIONS


_REPLICA = re.compile(r"(?:[0-9]+:[0-9]+)?", re.ASCII)


def is_throttled_replica_list(items: list[str]) -> bool:
    """ThrottledReplicaListValidator: ``*`` alone, or ``partition:broker`` items."""
    return (all(_REPLICA.fullmatch(java_trim(i)) for i in items)
            or java_trim("".join(items)) == "*")
