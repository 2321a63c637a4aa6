"""No login message may freeze the event loop (issue 19, items 1 and 7).

Against a gateway process with a SASL_PLAINTEXT and a PLAINTEXT listener,
over raw sockets: each attack that used to hold the event loop for seconds
(SASLprep of a 16 MiB PLAIN password or SCRAM user name, a v0 token of 8M
"é", any frame over 512 KiB before authentication) while a canary on the
PLAINTEXT listener sends ApiVersions in a loop. The canary's worst latency
stays small, the attacker gets Kafka's answer (or its connection closed, as
Kafka closes it), and the gateway's RSS does not grow with the attack.
The same sizes just under the frame cap reach the user name and password
caps. Failed logins are answered after connection.failed.authentication.delay.ms,
by a timer: the canary is not held up, and a good login is not delayed.
Client strings reach the log escaped and bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from common.logtext import LOGGED_TEXT_CHARS, client_text
from kafka_gateway import settings
from kafka_gateway.client import AuthenticationError, ClientSecurity, KafkaClient
from kafka_gateway.security.sasl import (
    MAX_PASSWORD_BYTES,
    MAX_SCRAM_MESSAGE_BYTES,
    MAX_USERNAME_BYTES,
    AuthenticationFailed,
    PlainServer,
    ScramServer,
)
from kafka_gateway.security.scram import Credentials
from kafka_gateway.settings import GatewayConfig
from testkit import prom
from testkit.gateway import GatewayProcess
from testkit.inprocess import port_of, running

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 30
MiB = 1 << 20
MAX_RECEIVE = 524_288  # sasl.server.max.receive.size, Kafka's default
DELAY_MS = 1000  # connection.failed.authentication.delay.ms of the gateway under test
CANARY_BOUND_S = 0.2  # the canary's worst ApiVersions round trip during an attack
RSS_BOUND_MIB = 24  # growth of the gateway's RSS during one attack
SASL_AUTHENTICATION_FAILED = 58
API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36


# ------------------------------------------------------------------ wire
def request(api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    payload = struct.pack(">hhih", api_key, version, correlation, 2) + b"hx" + body
    return struct.pack(">i", len(payload)) + payload


def handshake(mechanism: str, version: int = 1) -> bytes:
    name = mechanism.encode()
    return request(SASL_HANDSHAKE, version, 1, struct.pack(">h", len(name)) + name)


def authenticate(token: bytes) -> bytes:
    """SaslAuthenticate v1 (not flexible: a plain int32 length before the bytes)."""
    return request(SASL_AUTHENTICATE, 1, 2, struct.pack(">i", len(token)) + token)


def raw_token(token: bytes) -> bytes:
    """A token after a v0 handshake: size-prefixed, no request header."""
    return struct.pack(">i", len(token)) + token


def read_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed by the gateway")
        out += chunk
    return bytes(out)


def read_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", read_exactly(sock, 4))
    return read_exactly(sock, size)


def closed_unanswered(sock: socket.socket) -> bool:
    """The gateway closed the connection without sending a byte."""
    sock.settimeout(TIMEOUT)
    try:
        return sock.recv(1 << 16) == b""
    except ConnectionResetError:  # closed with our unread bytes in its buffer: RST
        return True


def send_all(sock: socket.socket, data: bytes) -> None:
    """Send, or stop when the gateway closes the connection under us."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(data)


def open_sasl(gateway: GatewayProcess, mechanism: str, version: int = 1) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gateway.listener_ports["SASL_PLAINTEXT"]),
                                    timeout=TIMEOUT)
    sock.sendall(handshake(mechanism, version))
    answer = read_frame(sock)
    assert struct.unpack_from(">ih", answer) == (1, 0), answer  # NONE: mechanism accepted
    return sock


def authenticate_error(sock: socket.socket) -> int:
    answer = read_frame(sock)
    correlation, error = struct.unpack_from(">ih", answer)
    assert correlation == 2
    return error


# ---------------------------------------------------------------- watching


class Canary(threading.Thread):
    """ApiVersions in a loop on the PLAINTEXT listener, timing each round trip and
    sampling the gateway's RSS, until stopped."""

    def __init__(self, gateway: GatewayProcess) -> None:
        super().__init__(daemon=True)
        self.gateway = gateway
        self.sock = socket.create_connection(("127.0.0.1", gateway.listener_ports["PLAINTEXT"]),
                                             timeout=TIMEOUT)
        self.latencies: list[float] = []
        self.peak_rss_kib = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        correlation = 0
        try:
            while not self._halt.is_set():
                correlation += 1
                started = time.perf_counter()
                self.sock.sendall(request(API_VERSIONS, 0, correlation, b""))
                answer = read_frame(self.sock)
                self.latencies.append(time.perf_counter() - started)
                assert struct.unpack_from(">ih", answer) == (correlation, 0)
                self.peak_rss_kib = max(self.peak_rss_kib, self.gateway.memory_kib())
                time.sleep(0.005)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> tuple[float, int]:
        """The worst latency (s) and the peak RSS sampled (KiB)."""
        self._halt.set()
        self.join(TIMEOUT)
        self.sock.close()
        assert self.error is None, f"canary failed: {self.error!r}"
        assert len(self.latencies) >= 3, f"canary ran {len(self.latencies)} times only"
        return max(self.latencies), self.peak_rss_kib


def under_attack(gateway: GatewayProcess, attack: Callable[[], None]) -> None:
    """Run ``attack`` with the canary going; bound its latency and the RSS growth."""
    rss_before = gateway.memory_kib()
    canary = Canary(gateway)
    canary.start()
    time.sleep(0.1)  # a few round trips before the attack
    try:
        attack()
        time.sleep(0.1)  # and a few after
    finally:
        worst, peak = canary.stop()
    assert worst < CANARY_BOUND_S, (
        f"ApiVersions on the PLAINTEXT listener took {worst * 1000:.0f} ms during the attack "
        f"(bound {CANARY_BOUND_S * 1000:.0f} ms)")
    growth = (peak - rss_before) / 1024
    assert growth < RSS_BOUND_MIB, (
        f"gateway RSS grew by {growth:.1f} MiB during the attack (bound {RSS_BOUND_MIB} MiB)")
    print(f"canary worst {worst * 1000:.1f} ms over {len(canary.latencies)} round trips; "
          f"RSS growth {growth:.1f} MiB")


def failures(gateway: GatewayProcess) -> float:
    return prom.value(gateway.metrics(), "kafka_gateway_authentication_failures_total")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hardening-sasl")
    with GatewayProcess(
            directory / "data",
            "--listeners", "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "--connection-failed-authentication-delay-ms", str(DELAY_MS),
            "--admin-listen", "127.0.0.1:0") as gw:
        done = subprocess.run(
            [sys.executable, "-m", "kafka_gateway", "users", "--bootstrap-server",
             gw.bootstrap_of("PLAINTEXT"), "add", "alice", "--password", "alice-secret"],
            cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        yield gw


# ------------------------------------------------------------------ attacks
def plain_token(user: bytes, password: bytes) -> bytes:
    return b"\x00" + user + b"\x00" + password


def scram_first(user: bytes) -> bytes:
    return b"n,,n=" + user + b",r=fyko+d2lbbFgONRv9qkxdawL"


E_ACUTE = "é".encode()
# name -> (mechanism, handshake version, the frame that attacks (made when the test
# runs), how Kafka ends it)
ATTACKS: dict[str, tuple[str, int, Callable[[], bytes], str]] = {
    # Over sasl.server.max.receive.size: refused from the size prefix, closed unanswered.
    "plain_16mib_password": (
        "PLAIN", 1, lambda: authenticate(plain_token(b"nobody", b"p" * 16 * MiB)), "closed"),
    "scram_16mib_username": (
        "SCRAM-SHA-256", 1, lambda: authenticate(scram_first(b"u" * 16 * MiB)), "closed"),
    "v0_token_8m_e_acute": (
        "PLAIN", 0, lambda: raw_token(plain_token(b"nobody", E_ACUTE * 8_000_000)), "closed"),
    # Under it, but over the user name and password caps: refused before SASLprep
    # (without the caps each of these holds the event loop for 0.3 to 1.4 s).
    "plain_500kib_password": (
        "PLAIN", 1, lambda: authenticate(plain_token(b"nobody", b"p" * 500_000)), "failed"),
    "plain_500kib_username": (
        "PLAIN", 1, lambda: authenticate(plain_token(b"u" * 500_000, b"x")), "failed"),
    "scram_500kib_username": (
        "SCRAM-SHA-512", 1, lambda: authenticate(scram_first(b"u" * 500_000)), "failed"),
    # After a v0 handshake a failure is not answered: closed, as Kafka does.
    "v0_token_250k_e_acute": (
        "PLAIN", 0, lambda: raw_token(plain_token(b"nobody", E_ACUTE * 250_000)), "closed"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ATTACKS)
def test_a_login_message_does_not_freeze_the_gateway(gateway, name):
    mechanism, version, make_frame, outcome = ATTACKS[name]
    frame = make_frame()
    sock = open_sasl(gateway, mechanism, version)
    failures_before = failures(gateway)
    ended: list[str] = []

    def attack() -> None:
        send_all(sock, frame)
        if outcome == "failed":
            assert authenticate_error(sock) == SASL_AUTHENTICATION_FAILED
            ended.append("answered SASL_AUTHENTICATION_FAILED")
        assert closed_unanswered(sock)
        ended.append("closed")

    try:
        under_attack(gateway, attack)
    finally:
        sock.close()
    assert ended[-1] == "closed", ended
    assert failures(gateway) == failures_before + 1  # counted as Kafka counts it


@pytest.mark.timeout(120)
def test_a_frame_just_above_the_cap_before_authentication_is_refused(gateway):
    """Even an ApiVersions, before the handshake: the size prefix alone ends it."""
    sock = socket.create_connection(("127.0.0.1", gateway.listener_ports["SASL_PLAINTEXT"]),
                                    timeout=TIMEOUT)
    body = b"\x00" * (MAX_RECEIVE + 1 - 12)
    frame = request(API_VERSIONS, 0, 7, body)
    assert len(frame) == 4 + MAX_RECEIVE + 1

    def attack() -> None:
        send_all(sock, frame)
        assert closed_unanswered(sock)

    try:
        under_attack(gateway, attack)
    finally:
        sock.close()
    assert "invalid receive size 524289" in gateway.output()


def test_a_frame_at_the_cap_is_read(gateway):
    """Exactly sasl.server.max.receive.size is still served (the token then fails on
    the password cap, answered as a wrong password)."""
    sock = open_sasl(gateway, "PLAIN")
    try:
        token_size = MAX_RECEIVE - (2 + 2 + 4 + 2 + 2) - 4
        frame = authenticate(plain_token(b"nobody", b"p" * (token_size - 8)))
        assert len(frame) == 4 + MAX_RECEIVE
        sock.sendall(frame)
        assert authenticate_error(sock) == SASL_AUTHENTICATION_FAILED
    finally:
        sock.close()


def test_after_authentication_frames_may_be_larger(gateway):
    """The cap holds before authentication only: then socket.request.max.bytes."""
    sock = open_sasl(gateway, "PLAIN")
    try:
        sock.sendall(authenticate(plain_token(b"alice", b"alice-secret")))
        assert authenticate_error(sock) == 0
        frame = request(API_VERSIONS, 0, 9, b"\x00" * MiB)  # ApiVersions v0 ignores the rest
        sock.sendall(frame)
        answer = read_frame(sock)
        assert struct.unpack_from(">i", answer) == (9,)
    finally:
        sock.close()


# ------------------------------------------------------------ failed logins
def login_seconds(gateway: GatewayProcess, password: bytes) -> tuple[float, int]:
    """Seconds from the token sent to SaslAuthenticate's answer, and its error code."""
    sock = open_sasl(gateway, "PLAIN")
    try:
        started = time.perf_counter()
        sock.sendall(authenticate(plain_token(b"alice", password)))
        error = authenticate_error(sock)
        return time.perf_counter() - started, error
    finally:
        sock.close()


@pytest.mark.timeout(120)
def test_a_failed_login_is_answered_after_the_delay_and_nothing_else_waits(gateway):
    measured: list[tuple[float, int]] = []

    def attack() -> None:
        for _ in range(3):
            measured.append(login_seconds(gateway, b"wrong"))

    under_attack(gateway, attack)  # the canary is not held up by the delays
    for seconds, error in measured:
        assert error == SASL_AUTHENTICATION_FAILED
        assert seconds >= DELAY_MS / 1000, (
            f"a wrong password was answered after {seconds * 1000:.0f} ms, before the "
            f"{DELAY_MS} ms delay")
    seconds, error = login_seconds(gateway, b"alice-secret")
    assert error == 0
    assert seconds < DELAY_MS / 1000, f"a good login took {seconds * 1000:.0f} ms"


def test_a_connection_is_muted_while_its_failure_is_delayed(gateway):
    """What a client pipelines behind a failed token is never served (Kafka mutes it)."""
    sock = open_sasl(gateway, "PLAIN")
    try:
        sock.sendall(authenticate(plain_token(b"alice", b"wrong"))
                     + request(API_VERSIONS, 0, 3, b""))
        assert authenticate_error(sock) == SASL_AUTHENTICATION_FAILED
        assert closed_unanswered(sock)
    finally:
        sock.close()


def test_the_settings_default_to_kafkas_and_refuse_nonsense(tmp_path):
    def parse(*argv: str) -> GatewayConfig:
        parser = argparse.ArgumentParser()
        settings.add_arguments(parser)
        return settings.from_arguments(parser.parse_args(argv))

    assert parse().failed_authentication_delay_ms == 100
    assert parse().sasl_server_max_receive_size == MAX_RECEIVE
    properties = tmp_path / "gateway.properties"
    properties.write_text("sasl.server.max.receive.size=1024\n"
                          "connection.failed.authentication.delay.ms=0\n")
    read = parse("--config", str(properties))
    assert (read.sasl_server_max_receive_size, read.failed_authentication_delay_ms) == (1024, 0)
    assert read.properties()["connection.failed.authentication.delay.ms"] == "0"
    with pytest.raises(ValueError, match=r"sasl\.server\.max\.receive\.size must"):
        parse("--sasl-server-max-receive-size", "0")
    with pytest.raises(ValueError, match=r"connection\.failed\.authentication\.delay\.ms must"):
        parse("--connection-failed-authentication-delay-ms", "-1")


# ---------------------------------------------------------------------- logs
def test_user_names_reach_the_log_escaped_and_bounded(tmp_path):
    """On a gateway of its own: bad-input lines are rate-limited per address."""
    with GatewayProcess(tmp_path / "data", "--listeners",
                        "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0") as gateway:
        _log_user_names(gateway)


def _log_user_names(gateway: GatewayProcess) -> None:
    before = len(gateway.output())
    for user in (b"eve\nINFO kafka_gateway: forged line", b"m" * MAX_USERNAME_BYTES):
        sock = open_sasl(gateway, "PLAIN")
        try:
            sock.sendall(authenticate(plain_token(user, b"wrong")))
            assert authenticate_error(sock) == SASL_AUTHENTICATION_FAILED
        finally:
            sock.close()
    # A 16 MiB user name: refused by the frame cap, never logged whole.
    sock = open_sasl(gateway, "PLAIN")
    try:
        send_all(sock, authenticate(plain_token(b"n" * 16 * MiB, b"x")))
        assert closed_unanswered(sock)
    finally:
        sock.close()
    deadline = time.monotonic() + TIMEOUT
    while gateway.output()[before:].count("failed authentication of") < 3:
        assert time.monotonic() < deadline, gateway.output()[before:]
        time.sleep(0.05)
    lines = gateway.output()[before:].splitlines()
    assert not [line for line in lines if line.startswith("INFO kafka_gateway: forged")], lines
    assert any("User:eve\\nINFO kafka_gateway: forged line from" in line for line in lines)
    long_name = [line for line in lines if "User:mmm" in line]
    assert len(long_name) == 1
    assert ("m" * LOGGED_TEXT_CHARS + f"... ({MAX_USERNAME_BYTES} chars in all)"
            in long_name[0])
    huge = [line for line in lines if "failed authentication of" in line
            and f"invalid receive size {len(plain_token(b'n' * 16 * MiB, b'x')) + 16}" in line]
    assert len(huge) == 1, lines
    assert max(len(line) for line in lines) < 1000, max(lines, key=len)[:300]


def test_client_text():
    assert client_text("alice") == "alice"
    assert client_text("a\nb\r\x1b[2J\\") == "a\\nb\\r\\x1b[2J\\\\"
    assert client_text(b"caf\xc3\xa9 \xff") == "café \\xff"
    assert client_text(None) == "null"
    huge = client_text("x" * (16 * MiB))
    assert huge == "x" * LOGGED_TEXT_CHARS + f"... ({16 * MiB} chars in all)"
    assert client_text(b"y" * (16 * MiB)).endswith(f"... ({16 * MiB} bytes in all)")
    assert client_text("z" * LOGGED_TEXT_CHARS) == "z" * LOGGED_TEXT_CHARS


class _NoUsers:
    """Records without a credential: every user is unknown (the decoy is derived)."""

    def get(self, _name: bytes) -> None:
        return None


def test_the_caps_leave_login_messages_cheap():
    """The largest user name, password and SCRAM message taken, of the costliest
    characters for SASLprep: each login message costs a few milliseconds at most,
    where 16 MiB took half a minute."""
    credentials = Credentials(_NoUsers())  # type: ignore[arg-type]
    worst: dict[str, float] = {}
    for char in ("a", "é", "\ufb03", "\u00ad"):
        user, password = _fill(char, MAX_USERNAME_BYTES), _fill(char, MAX_PASSWORD_BYTES)
        nonce = b"r" * (MAX_SCRAM_MESSAGE_BYTES - len(user) - 16)
        cases = {
            "PLAIN": (functools.partial(PlainServer, credentials),
                      b"\x00" + user + b"\x00" + password),
            "SCRAM client-first": (functools.partial(ScramServer, "SCRAM-SHA-512", credentials),
                                   b"n,,n=" + user + b",r=" + nonce),
        }
        for name, (server, token) in cases.items():
            best = min(_timed(functools.partial(_refused, server, token)) for _ in range(5))
            worst[name] = max(worst.get(name, 0.0), best)
    print("login message at the caps:", {k: f"{v * 1000:.2f} ms" for k, v in worst.items()})
    assert max(worst.values()) < 0.05, worst


def test_a_scram_user_name_is_unescaped_once():
    """RFC 5802: "=3D" on the wire is "="; the user "a=2Cb" is not "a,b"."""
    server = ScramServer("SCRAM-SHA-256", Credentials(_NoUsers()))  # type: ignore[arg-type]
    with pytest.raises(AuthenticationFailed) as failed:
        server.step(b"n,,n=a=3D2Cb,r=abcdefgh")
    assert failed.value.user == "a=2Cb"


def _fill(char: str, size: int) -> bytes:
    return (char * (size // len(char.encode()))).encode()


def _refused(server: Callable[[], PlainServer | ScramServer], token: bytes) -> None:
    """A new server's first step, which fails (no such user)."""
    with pytest.raises(AuthenticationFailed):
        server().step(token)


def _timed(function: Callable[[], object]) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def test_no_delay_when_set_to_zero(tmp_path):
    """connection.failed.authentication.delay.ms=0: answered and closed at once (the
    path without a timer), in process."""

    async def main() -> None:
        async with running(tmp_path, listeners="SASL_PLAINTEXT://127.0.0.1:0",
                           failed_authentication_delay_ms=0) as server:
            port = port_of(server, "SASL_PLAINTEXT")
            client = await KafkaClient.connect("127.0.0.1", port)
            with pytest.raises(AuthenticationError, match="SASL_AUTHENTICATION_FAILED"):
                await client.authenticate(ClientSecurity(mechanism="PLAIN", username="x",
                                                         password="y"))
            assert await asyncio.wait_for(client._reader.read(1), TIMEOUT) == b""
            await client.close()
            assert server.broker.metrics.authentication_failures == 1

    asyncio.run(main())
