"""Kafka's connection quotas and the TLS handshake timeout, against a live gateway
(uvloop, as deployed) over raw sockets.

- half-finished TLS handshakes are closed after ``gateway.ssl.handshake.timeout.ms``;
- ``max.connections.per.ip`` (and its overrides, by IP and by host name) and
  ``max.connections`` refuse NEW connections, counted from accept (a half-done
  TLS handshake counts), while the open ones keep working.

Every wait has a generous deadline; nothing asserts how fast the gateway is.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import struct
import time

from test_connection_limits import (
    TIMEOUT,
    answered,
    api_versions_frame,
    closed_by_peer,
    metrics,
    read_frame,
    wait_for,
)

from testkit.certs import make_pki
from testkit.gateway import GatewayProcess

# The first bytes of a TLS record carrying a ClientHello: a handshake that never ends.
CLIENT_HELLO_START = b"\x16\x03\x01\x02"
REFUSED_PER_IP = 'kafka_gateway_connections_refused_total{limit="max.connections.per.ip"}'
REFUSED_NODE = 'kafka_gateway_connections_refused_total{limit="max.connections"}'


def open_sockets(gateway: GatewayProcess) -> int:
    """Sockets the gateway process has open, from /proc (fails loudly when unreadable)."""
    assert gateway.process is not None
    fd_dir = f"/proc/{gateway.process.pid}/fd"
    count = 0
    for name in os.listdir(fd_dir):
        try:
            if os.readlink(f"{fd_dir}/{name}").startswith("socket:"):
                count += 1
        except FileNotFoundError:  # closed while listed
            continue
    return count


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.settimeout(TIMEOUT)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def works(sock: socket.socket, correlation: int) -> bool:
    """This (already open) connection still gets its ApiVersions answered."""
    sock.sendall(api_versions_frame(correlation))
    return struct.unpack_from(">ih", read_frame(sock)) == (correlation, 0)


def refused(port: int, source: str = "127.0.0.1") -> bool:
    """A new connection is closed by the gateway without an answer (the reset can
    come before connect() returns: the gateway accepts and resets at once)."""
    try:
        sock = connect(port, source)
    except ConnectionResetError:
        return True
    try:
        try:
            sock.sendall(api_versions_frame(77))
        except (BrokenPipeError, ConnectionResetError):
            return True
        return closed_by_peer(sock)
    finally:
        sock.close()


def tls_client(port: int, ca: str) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=ca)
    context.check_hostname = False
    raw = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    return context.wrap_socket(raw)


def _half_open_wave(gateway: GatewayProcess, port: int, attackers: int) -> tuple[int, float]:
    """``attackers`` connections send 4 bytes of a ClientHello and wait; returns how
    many more sockets the gateway held and how long until all were closed."""
    sockets_before = open_sockets(gateway)
    started = time.monotonic()
    socks = []
    for _ in range(attackers):
        sock = connect(port)
        sock.sendall(CLIENT_HELLO_START)
        socks.append(sock)
    # The premise: every one of them was accepted and is mid-handshake.
    wait_for(lambda: metrics(gateway)["kafka_gateway_tls_handshakes_in_progress"]
             == attackers, "every half-open handshake to be accepted")
    held = open_sockets(gateway) - sockets_before
    # (give or take the admin HTTP connections of the metrics reads)
    assert held >= attackers - 2, f"the gateway holds {held} more sockets, not {attackers}"
    for sock in socks:
        assert closed_by_peer(sock), "a half-open handshake outlived its timeout"
    waited = time.monotonic() - started
    for sock in socks:
        sock.close()
    wait_for(lambda: open_sockets(gateway) <= sockets_before + 2,
             "the gateway to close their sockets")
    assert metrics(gateway)["kafka_gateway_tls_handshakes_in_progress"] == 0
    return held, waited


def test_half_finished_tls_handshakes_are_closed_after_the_timeout(tmp_path):
    """Two waves of 1,000 connections that sent 4 bytes of a ClientHello: each closed
    after the 2 s handshake timeout, the gateway's sockets back down each time, the
    second wave reuses the first one's memory; a real TLS client gets through."""
    attackers, timeout_ms = 1000, 2000
    pki = make_pki(tmp_path / "pki")
    with GatewayProcess(tmp_path / "data", "--admin-listen", "127.0.0.1:0",
                        "--listeners", "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
                        "--ssl-keystore-location", str(pki.server),
                        "--ssl-handshake-timeout-ms", str(timeout_ms)) as gateway:
        port = gateway.listener_ports["SSL"]
        with tls_client(port, str(pki.ca)) as client:
            assert works(client, 1)
        wait_for(lambda: metrics(gateway)["kafka_gateway_connections"] == 0,
                 "the first client to be closed")
        rss_before = gateway.memory_kib("VmRSS")
        held, waited = _half_open_wave(gateway, port, attackers)
        rss_first = gateway.memory_kib("VmHWM") - rss_before
        held_again, waited_again = _half_open_wave(gateway, port, attackers)
        rss_second = gateway.memory_kib("VmHWM") - rss_before
        print(f"\n{attackers} half-open TLS handshakes, twice: +{held}/+{held_again} "
              f"sockets, closed after {waited:.1f}/{waited_again:.1f} s; peak RSS "
              f"+{rss_first} KiB after the first wave, +{rss_second} KiB after the second")
        assert metrics(gateway)["kafka_gateway_tls_handshake_timeouts_total"] == 2 * attackers
        assert waited < timeout_ms / 1000 + TIMEOUT and waited_again < timeout_ms / 1000 + TIMEOUT
        # No TLS state is made before a whole ClientHello record is in (it would be
        # ~64 KiB each: 62 MiB for this wave, measured), so each costs a socket and
        # a few KiB (4.6 MiB for the wave, measured), for the timeout at most.
        assert rss_first < attackers * 16, f"peak RSS grew by {rss_first} KiB"
        assert rss_second - rss_first < attackers * 4, (
            f"the second wave grew the peak RSS by {rss_second - rss_first} KiB more")
        with tls_client(port, str(pki.ca)) as client:
            assert works(client, 3)


def _handshake_in_pieces(port: int, ca: str, pieces: int, pause: float) -> ssl.SSLObject:
    """A TLS client whose ClientHello goes out in ``pieces``, ``pause`` s apart."""
    context = ssl.create_default_context(cafile=ca)
    context.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing)
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    step = -(-len(hello) // pieces)
    for start in range(0, len(hello), step):
        sock.sendall(hello[start:start + step])
        time.sleep(pause)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            if pending := outgoing.read():
                sock.sendall(pending)
            data = sock.recv(65536)
            assert data, "the gateway closed the connection during the handshake"
            incoming.write(data)
    sock.sendall(outgoing.read())
    tls.write(api_versions_frame(5))
    sock.sendall(outgoing.read())
    answer = b""
    while len(answer) < 10:
        try:
            answer += tls.read(65536)
        except ssl.SSLWantReadError:
            data = sock.recv(65536)
            assert data, "closed before the answer"
            incoming.write(data)
    sock.close()
    assert struct.unpack_from(">iih", answer)[1:] == (5, 0)
    return tls


def test_a_client_hello_in_pieces_and_plaintext_on_a_tls_port(tmp_path):
    """The ClientHello's record arriving in pieces (0.5 s apart) is waited for;
    plaintext sent to a TLS port fails the handshake at once, not at the timeout."""
    pki = make_pki(tmp_path / "pki")
    with GatewayProcess(tmp_path / "data", "--admin-listen", "127.0.0.1:0",
                        "--listeners", "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
                        "--ssl-keystore-location", str(pki.server),
                        "--ssl-handshake-timeout-ms", "5000") as gateway:
        port = gateway.listener_ports["SSL"]
        _handshake_in_pieces(port, str(pki.ca), pieces=4, pause=0.5)
        started = time.monotonic()
        with connect(port) as sock:
            sock.sendall(api_versions_frame(1))
            assert closed_by_peer(sock, within=4)
        assert time.monotonic() - started < 4
        values = metrics(gateway)
        assert values["kafka_gateway_tls_handshake_failures_total"] == 1
        assert values["kafka_gateway_tls_handshake_timeouts_total"] == 0


def test_max_connections_per_ip_refuses_new_ones_and_honours_overrides(tmp_path):
    """3 per address; 127.0.0.2 may have 6 (by IP) and 127.0.0.1 5 (by host name)."""
    with GatewayProcess(tmp_path / "data", "--admin-listen", "127.0.0.1:0",
                        "--max-connections-per-ip", "3",
                        "--max-connections-per-ip-overrides",
                        "127.0.0.2:6, localhost:5") as gateway:
        port = gateway.port
        for source, limit in (("127.0.0.1", 5), ("127.0.0.2", 6), ("127.0.0.3", 3)):
            before = metrics(gateway)[REFUSED_PER_IP]
            held = [connect(port, source) for _ in range(limit)]
            assert all(works(sock, i) for i, sock in enumerate(held))
            assert refused(port, source), f"connection {limit + 1} from {source} was kept"
            assert refused(port, source)
            assert metrics(gateway)[REFUSED_PER_IP] == before + 2
            # The open ones were not touched, and closing one makes room.
            assert all(works(sock, 10 + i) for i, sock in enumerate(held))
            held.pop().close()
            wait_for(lambda left=limit - 1: metrics(gateway)["kafka_gateway_connections"] == left,
                     "the closed connection to be counted out")
            replacement = connect(port, source)
            assert works(replacement, 20)
            for sock in [*held, replacement]:
                sock.close()
            wait_for(lambda: metrics(gateway)["kafka_gateway_connections"] == 0,
                     f"the connections from {source} to close")
        assert "Rejected connection from 127.0.0.3, address already has the configured " \
               "maximum of 3 connections" in gateway.output()


def test_half_open_tls_handshakes_count_against_the_per_ip_limit(tmp_path):
    """Counted from accept, as Kafka counts: 4 silent TLS connections fill a limit
    of 4, the 5th is refused, and once they time out there is room again."""
    pki = make_pki(tmp_path / "pki")
    with GatewayProcess(tmp_path / "data", "--admin-listen", "127.0.0.1:0",
                        "--listeners", "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
                        "--ssl-keystore-location", str(pki.server),
                        "--ssl-handshake-timeout-ms", "3000",
                        "--max-connections-per-ip", "4") as gateway:
        tls_port, plain_port = gateway.listener_ports["SSL"], gateway.listener_ports["PLAINTEXT"]
        silent = [connect(tls_port) for _ in range(4)]
        wait_for(lambda: metrics(gateway)["kafka_gateway_tls_handshakes_in_progress"] == 4,
                 "the silent handshakes to be accepted")
        # Every listener counts against one limit per address.
        assert refused(plain_port)
        assert refused(tls_port)
        assert metrics(gateway)[REFUSED_PER_IP] == 2
        for sock in silent:
            assert closed_by_peer(sock)
            sock.close()
        wait_for(lambda: metrics(gateway)["kafka_gateway_tls_handshakes_in_progress"] == 0,
                 "the handshakes to time out")
        with tls_client(tls_port, str(pki.ca)) as client:
            assert works(client, 1)
        assert answered(gateway)


def test_max_connections_refuses_new_ones_node_wide(tmp_path):
    with GatewayProcess(tmp_path / "data", "--admin-listen", "127.0.0.1:0",
                        "--max-connections", "6") as gateway:
        port = gateway.port
        held = [connect(port, f"127.0.0.{1 + i % 3}") for i in range(6)]
        assert all(works(sock, i) for i, sock in enumerate(held))
        for source in ("127.0.0.1", "127.0.0.4"):
            assert refused(port, source)
        assert metrics(gateway)[REFUSED_NODE] == 2
        assert metrics(gateway)[REFUSED_PER_IP] == 0
        assert all(works(sock, 10 + i) for i, sock in enumerate(held))
        held.pop().close()
        wait_for(lambda: metrics(gateway)["kafka_gateway_connections"] == 5,
                 "the closed connection to be counted out")
        replacement = connect(port, "127.0.0.5")
        assert works(replacement, 20)
        for sock in [*held, replacement]:
            sock.close()
