"""One client connection: framing, dispatch and in-order responses.

Requests are read as they arrive (clients pipeline) and each runs as its own
task, so a long-polling Fetch does not hold up a Produce behind it; answers
are written strictly in request order, as the protocol requires. The parts,
one module each, share a ``ConnectionState`` (state.py) and are put together
by ``KafkaConnection`` (protocol.py, which also applies backpressure):

- read_buffer.py: the read buffer, charged to the node's request memory
  (``queued.max.request.bytes``, request_memory.py), grown with the bytes
  actually received, never from a length prefix alone;
- framing.py: size-prefixed frames cut out of it, an oversized prefix refused;
- dispatch.py: a frame becomes a request served by its API's handler, or
  closes the connection if it cannot be read or asks for what is not served;
  the one place where a handler's unexpected error is caught and counted;
- answers.py: the answers, written in request order, as ~64 KiB buffers;
- timers.py: ``connections.max.idle.ms`` and ``gateway.partial.request.timeout.ms``;
- sasl_hooks.py: what a SASL listener's connection does for its ``SaslGate``
  (security/sasl.py) until the client has authenticated.

A malformed or oversized frame, or a request for an API or version this
gateway does not implement, closes this connection only, and is logged, at
most a few lines a minute per client address (bad_input.py).

Security (security/): each connection belongs to a listener. On a TLS
listener the transport is TLS (set up by the server) and a client certificate
names the principal; on a SASL listener the SASL gate sees every frame until
the client has authenticated. Handlers find the listener and principal in
``request.session``.
"""

from __future__ import annotations

import logging

from .protocol import KafkaConnection

__all__ = ["KafkaConnection", "log"]

log = logging.getLogger(__name__)
