"""Kafka's connection quotas: ``max.connections``, ``max.connections.per.ip``
and ``max.connections.per.ip.overrides`` (Kafka's ConnectionQuotas).

A connection is counted from the moment it is accepted, before any TLS
handshake or SASL authentication (as Kafka's Acceptor counts it), and
uncounted when its socket closes. A new connection past a limit is closed at
once; the connections already open are never touched:

- per address, as Kafka: the connection is accepted and closed at once
  ("Rejected connection from ..., address already has the configured maximum
  of N connections"); the client sees the connection closed and reconnects
  after its backoff;
- node-wide (``max.connections``), Kafka stops accepting until a connection
  closes, so new ones wait in the listen backlog; the gateway accepts and
  closes them instead, so a client learns at once (and retries after its
  backoff) rather than when its connection setup times out.

An address is the client's IP (an IPv4-mapped IPv6 address counts as the IPv4
one, as Java's InetAddress makes it); overrides name IPs or host names, a name
resolved once at start-up as Kafka does.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from dataclasses import dataclass, field

from .metrics import Metrics

MAX_CONNECTIONS = "max.connections"
MAX_CONNECTIONS_PER_IP = "max.connections.per.ip"


def parse_overrides(value: str) -> dict[str, int]:
    """``HOST_OR_IP:COUNT,...`` (Kafka's parseCsvMap: the last ':' splits, so IPv6 works)."""
    out: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        host, sep, count = item.rpartition(":")
        if not sep or not host.strip() or not count.strip().isdigit():
            raise ValueError(f"max.connections.per.ip.overrides: expected HOST_OR_IP:COUNT, "
                             f"got {item!r}")
        out[host.strip()] = int(count)
    return out


def canonical(address: str) -> str:
    """One spelling per client address (IPv4-mapped IPv6 as IPv4, no zone)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def _resolve(host: str) -> str:
    try:
        return canonical(str(ipaddress.ip_address(host)))
    except ValueError:
        pass
    try:
        return canonical(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except OSError as exc:
        raise ValueError(f"max.connections.per.ip.overrides: cannot resolve {host!r}: "
                         f"{exc}") from exc


@dataclass(eq=False, slots=True)
class Slot:
    """One counted connection; ``release`` uncounts it (once, however often called)."""

    quotas: ConnectionQuotas
    address: str
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.quotas._release(self.address)


@dataclass(slots=True)
class ConnectionQuotas:
    max_connections: int
    max_per_ip: int
    overrides: dict[str, int]  # canonical address -> its own limit
    metrics: Metrics
    log: object  # a bad_input.BadInputLog
    counts: dict[str, int] = field(default_factory=dict)
    total: int = 0

    @classmethod
    def from_config(cls, config: object, metrics: Metrics, log: object) -> ConnectionQuotas:
        overrides = {_resolve(host): count for host, count in
                     parse_overrides(config.max_connections_per_ip_overrides).items()}  # type: ignore[attr-defined]
        return cls(config.max_connections, config.max_connections_per_ip,  # type: ignore[attr-defined]
                   overrides, metrics, log)

    def limit_of(self, address: str) -> int:
        return self.overrides.get(address, self.max_per_ip)

    def acquire(self, address: str) -> Slot | None:
        """Count a connection just accepted from ``address``; None: refuse it."""
        address = canonical(address)
        count = self.counts.get(address, 0)
        if self.total >= self.max_connections:
            self._refuse(MAX_CONNECTIONS, address,
                         "node already has the configured maximum of %d connections",
                         self.max_connections)
            return None
        limit = self.limit_of(address)
        if count >= limit:
            self._refuse(MAX_CONNECTIONS_PER_IP, address,
                         "address already has the configured maximum of %d connections",
                         limit)
            return None
        self.counts[address] = count + 1
        self.total += 1
        return Slot(self, address)

    def _release(self, address: str) -> None:
        self.total -= 1
        count = self.counts[address] - 1
        if count:
            self.counts[address] = count
        else:
            del self.counts[address]  # no entry kept per address ever seen

    def _refuse(self, limit: str, address: str, why: str, count: int) -> None:
        self.metrics.connections_refused[limit] += 1
        self.log.log(address, logging.INFO,  # type: ignore[attr-defined]
                     "Rejected connection from %s, " + why, address, count)
