"""Text a client chose (a user name, a group or transactional id, a topic
name), made safe for a log line: cut to a bounded length before any other
work, and escaped, so a newline cannot forge a line and a 16 MiB name costs
what a short one does. In ``common``, so that the storage layer, the
transaction coordinator and the protocol layer all log client strings the
same way.
"""

from __future__ import annotations

# Characters of one client-supplied string kept in a log line.
LOGGED_TEXT_CHARS = 200


def client_text(value: str | bytes | bytearray | memoryview | None,
                limit: int = LOGGED_TEXT_CHARS) -> str:
    """``value``, chosen by a client, as it may appear in a log line.

    Only the first ``limit`` characters are kept (cut before anything else, so
    a 16 MiB name costs no more than a short one) and the rest counted; a
    backslash and every character that is not printable (a newline would
    start a forged log line, an escape sequence would drive the terminal) are
    written as Python escapes; undecodable bytes as ``\\xNN``.
    """
    if value is None:
        return "null"
    if isinstance(value, str):
        text, size, unit = value[:limit], len(value), "chars"
    else:
        head = bytes(value[: 4 * limit])  # a character is at most 4 bytes of UTF-8
        text, size, unit = head.decode("utf-8", "surrogateescape")[:limit], len(value), "bytes"
    escaped = "".join(map(_escape_char, text))
    kept = len(text.encode("utf-8", "surrogateescape")) if unit == "bytes" else len(text)
    if kept < size:
        escaped += f"... ({size} {unit} in all)"
    return escaped


def _escape_char(c: str) -> str:
    if c.isprintable() and c != "\\":
        return c
    if "\udc80" <= c <= "\udcff":  # an undecodable byte (surrogateescape)
        return f"\\x{ord(c) - 0xDC00:02x}"
    return repr(c)[1:-1]
