"""Listeners in Kafka's syntax: ``listeners``, ``advertised.listeners`` and
``listener.security.protocol.map``.

    listeners=PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9094,INTERNAL://:9095
    advertised.listeners=PLAINTEXT://127.0.0.1:9092,SASL_SSL://kafka.example:9094,...
    listener.security.protocol.map=INTERNAL:SSL     (added to the default map)

A listener is named; its security protocol comes from the map, whose default
maps each protocol's name to itself (as Kafka's does). An empty host listens
on every interface. Each listener is advertised at the address of the same
name in ``advertised.listeners``, or at its own address when that has none;
Metadata and FindCoordinator answer a client with the advertised address of
the listener it came in on, so a client that bootstrapped over SASL_SSL keeps
using SASL_SSL.

Settings of one listener can be set apart with Kafka's prefix
``listener.name.<lower-case name>.``: ``ssl.*``, ``sasl.enabled.mechanisms``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_LISTENER = re.compile(r"^([A-Za-z0-9_]+)://(\[[0-9A-Fa-f:.]*\]|[^:/\[\]]*):(\d+)$")


class ListenerError(ValueError):
    """A listener setting that cannot be used; the gateway does not start."""


@dataclass(frozen=True, slots=True)
class Listener:
    name: str  # upper-case, as Kafka keeps it
    protocol: str  # one of PROTOCOLS
    host: str  # "" = every interface
    port: int
    advertised_host: str
    advertised_port: int
    # This listener's own settings (listener.name.<name>.*), without the prefix.
    settings: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def advertised(self) -> tuple[str, int]:
        return self.advertised_host, self.advertised_port

    def bound(self, port: int) -> Listener:
        """This listener once bound to ``port`` (a port 0 chosen at run time
        is also the advertised one, unless another was advertised)."""
        advertised_port = port if self.advertised_port in (0, self.port) else self.advertised_port
        return replace(self, port=port, advertised_port=advertised_port)

    def url(self, advertised: bool = False) -> str:
        host, port = self.advertised if advertised else (self.host, self.port)
        return f"{self.name}://{host}:{port}"


def _endpoints(value: str, what: str) -> list[tuple[str, str, int]]:
    out = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        match = _LISTENER.match(item)
        if match is None:
            raise ListenerError(f"{what}: expected NAME://HOST:PORT, got {item!r}")
        name, host, port = match.group(1).upper(), match.group(2), int(match.group(3))
        if host.startswith("["):
            host = host[1:-1]
        out.append((name, host, port))
    names = [name for name, _h, _p in out]
    if len(set(names)) != len(names):
        raise ListenerError(f"{what}: each listener name may appear once, got {value!r}")
    return out


def protocol_map(value: str) -> dict[str, str]:
    """``listener.security.protocol.map`` on top of the default (each protocol to itself)."""
    mapping = {p: p for p in PROTOCOLS}
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, protocol = item.partition(":")
        if not sep or protocol.upper() not in PROTOCOLS:
            raise ListenerError(
                f"listener.security.protocol.map: expected NAME:PROTOCOL with a protocol of "
                f"{', '.join(PROTOCOLS)}, got {item!r}")
        mapping[name.strip().upper()] = protocol.upper()
    return mapping


def parse_listeners(listeners: str, advertised: str, security_map: str,
                    per_listener: dict[str, dict[str, str]] | None = None) -> list[Listener]:
    """The listeners to open, in the order given (the first one is the default)."""
    mapping = protocol_map(security_map)
    explicit = _endpoints(advertised, "advertised.listeners")
    ads = {name: (host, port) for name, host, port in explicit}
    out = []
    for name, host, port in _endpoints(listeners, "listeners"):
        protocol = mapping.get(name)
        if protocol is None:
            raise ListenerError(f"listener {name} has no security protocol: add it to "
                                "listener.security.protocol.map")
        if name in ads:
            ad_host, ad_port = ads.pop(name)
            if ad_host in ("", "0.0.0.0", "::"):  # as Kafka, which refuses them too
                raise ListenerError(f"advertised.listeners: {name} cannot advertise the "
                                    f"meta-address {ad_host or '(empty)'}")
        else:
            # An empty host (every interface) is advertised as loopback.
            ad_host, ad_port = host or "127.0.0.1", port
        settings = dict((per_listener or {}).get(name.lower(), {}))
        out.append(Listener(name, protocol, host, port, ad_host, ad_port, settings))
    if not out:
        raise ListenerError("listeners: at least one listener is needed")
    if ads:
        raise ListenerError(f"advertised.listeners names {', '.join(sorted(ads))}, which "
                            "listeners does not")
    ports = [listener.port for listener in out if listener.port]
    if len(set(ports)) != len(ports):
        raise ListenerError(f"listeners: two listeners on one port in {listeners!r}")
    return out
