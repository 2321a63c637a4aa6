"""The private parts of libraries this gateway needs, behind one door.

Neither library has a public API for these; each name here is pinned by
tests/test_thirdparty.py, which fails when an upgrade changes it (read the
new version's source then, and adapt this module, not its users).

- kio (0.6): its schema introspection, which body_bounds.py compiles its
  walks from (so that the check and kio's reader agree on each field's wire
  form) and testkit/fuzz.py its mutations;
- scramp (1.5): the server-final of a client-final whose nonce carries the
  client's nonce in front of the full one (librdkafka before 2.2).
"""

from __future__ import annotations

from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from scramp import ScramException
from scramp import core as _scramp_core

__all__ = [
    "EntityField",
    "EntityTupleField",
    "PrimitiveField",
    "PrimitiveTupleField",
    "classify_field",
    "get_field_tag",
    "get_schema_field_type",
    "is_optional",
    "scram_server_final_for_nonce",
]


def scram_server_final_for_nonce(server: Any, message: str) -> str:
    """The server-final for ``message`` (client-final) on scramp's ``server``
    (after server-first), accepting a nonce that ends with the full nonce but
    has more in front: librdkafka before 2.2 (Debian's kcat) sends its client
    nonce again there. Kafka's server does not compare that nonce, only the
    proof, which covers the message as sent; scramp compares it. Accepted when
    the nonce ends with the whole nonce of server-first, so the server's part is
    in it (a replay still fails), and then checked by scramp's own proof check.
    Raises ``ScramException`` otherwise."""
    final = _scramp_core.ClientFinal(message)
    sent, ours = str(final["r"]), str(server.nonce)
    if not sent.endswith(ours) or sent == ours:
        raise ScramException("Server nonce doesn't match.")
    signature = _scramp_core._set_client_final(
        server.m.hf, final, final["r"], server.stored_key, server.server_key,
        server.client_first_bare, server.server_first, server.cb, server.gs2_header)
    return _scramp_core._get_server_final(signature, None)
