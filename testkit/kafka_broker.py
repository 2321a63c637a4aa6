"""Apache Kafka 3.4.1 as a reference broker: KRaft, one node, loopback, heap capped.

    with KafkaBroker(tmp_path) as kafka:
        Producer({"bootstrap.servers": kafka.bootstrap})

    # More client listeners, each with its protocol, on free ports of their own:
    with KafkaBroker(tmp_path, listeners={"SASL_PLAINTEXT": "SASL_PLAINTEXT"},
                     overrides={...SASL and ACL settings...}) as kafka:
        kafka.listener_ports["SASL_PLAINTEXT"]

One process is broker and controller, formatted in a fresh directory, on free
loopback ports. It is ready when it answers ApiVersions on its client port.
Its log is kept beside the data (``kafka.log``) and quoted when start-up fails.
Used by the differential tests (``compat_tests``) and by the benchmark (``bench``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

from kio.schema.api_versions.v3 import request as api_versions
from kio.schema.metadata.v12 import request as metadata

from kafka_gateway.client import KafkaClient

from . import jvm


def free_port() -> int:
    """A loopback port the OS had free a moment ago (the server binds it right after)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Settings that make one node behave as Kafka's quick-start does; anything a
# test or benchmark wants to differ is passed as ``overrides``.
DEFAULTS = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "num.partitions": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
}


class KafkaBroker:
    def __init__(self, directory: str | os.PathLike[str], overrides: dict[str, str] | None = None,
                 heap: str = "1g", startup_timeout: float = 120.0,
                 listeners: dict[str, str] | None = None) -> None:
        self.directory = Path(directory)
        self.overrides = dict(overrides or {})
        self.extra_listeners = dict(listeners or {})  # name -> security protocol
        self.listener_ports: dict[str, int] = {}
        self.heap = heap
        self.startup_timeout = startup_timeout
        self.port = 0
        self.controller_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.directory / "kafka.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def host_port(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def _java(self, main_class: str, *args: str) -> list[str]:
        return [jvm.tool("java"), f"-Xms{self.heap}", f"-Xmx{self.heap}",
                "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j.configuration=file:{jvm.LOG4J}",
                "-cp", jvm.classpath(), main_class, *args]

    def _write_properties(self) -> Path:
        self.port, self.controller_port = free_port(), free_port()
        self.listener_ports = {name: free_port() for name in self.extra_listeners}
        extra = "".join(f",{name}://127.0.0.1:{port}" for name, port in self.listener_ports.items())
        props = {
            **DEFAULTS,
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
                         f"CONTROLLER://127.0.0.1:{self.controller_port}{extra}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}{extra}",
            "listener.security.protocol.map": DEFAULTS["listener.security.protocol.map"] + "".join(
                f",{name}:{protocol}" for name, protocol in self.extra_listeners.items()),
            "log.dirs": str(self.directory / "logs"),
            **self.overrides,
        }
        path = self.directory / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def start(self) -> KafkaBroker:
        self.directory.mkdir(parents=True, exist_ok=True)
        properties = self._write_properties()
        cluster_id = uuid.uuid4().hex[:22]
        with open(self.log_path, "ab") as log:
            formatted = subprocess.run(
                self._java("kafka.tools.StorageTool", "format", "-t", cluster_id,
                           "-c", str(properties), "--ignore-formatted"),
                stdout=log, stderr=subprocess.STDOUT, timeout=120)
            if formatted.returncode != 0:
                raise RuntimeError(f"formatting Kafka's log dir failed:\n{self.output()}")
            self.process = subprocess.Popen(
                self._java("kafka.Kafka", str(properties)), stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while not self._answers_api_versions():
            if self.process.poll() is not None:
                raise RuntimeError(f"Kafka exited at start-up:\n{self.output()}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"Kafka not ready in {self.startup_timeout}s:\n"
                                   f"{self.output()}")
            time.sleep(0.25)
        return self

    def _answers_api_versions(self) -> bool:
        """Ready: it answers ApiVersions, and its Metadata lists itself and a
        controller (a moment later; an admin request sent in between can stall
        for 20 s in librdkafka)."""
        async def probe() -> None:
            client = await KafkaClient.connect(*self.host_port)
            try:
                await client.request(api_versions.ApiVersionsRequest(
                    client_software_name="kafka-gateway-testkit", client_software_version="1"))
                answer = await client.request(metadata.MetadataRequest(
                    topics=(), allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False))
                if not answer.brokers or answer.controller_id < 0:
                    raise EOFError("no broker or controller in Metadata yet")
            finally:
                await client.close()

        try:
            asyncio.run(asyncio.wait_for(probe(), 5))
        except (TimeoutError, OSError, EOFError, asyncio.IncompleteReadError):
            return False
        return True

    def output(self, tail: int = 8000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a controlled shutdown), then SIGKILL if it does not exit."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
