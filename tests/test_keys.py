"""tablets.keys.prefix_end: the end of a scan over every key with a prefix."""

import pytest

from tablets import keys


def test_prefix_end_is_above_every_key_of_the_prefix_even_after_a_0xff_byte():
    # A blob key: the kind, then a random topic id whose first byte may be 0xff.
    key = keys.TXN_BLOB + b"\xff" * 16 + bytes(12)
    assert keys.TXN_BLOB <= key < keys.prefix_end(keys.TXN_BLOB)
    assert not key < keys.TXN_BLOB + b"\xff"  # the bound this replaces missed it
    assert keys.prefix_end(b"B") == b"C"
    assert keys.prefix_end(b"a\xff") == b"b"
    assert keys.prefix_end(keys.TXN_BLOB) <= keys.TXN_BLOB[:-1] + bytes([keys.TXN_BLOB[-1] + 1])


def test_a_prefix_of_only_0xff_has_no_end():
    with pytest.raises(ValueError):
        keys.prefix_end(b"\xff\xff")
