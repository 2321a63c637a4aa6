"""The fuzz run's bounds fail loudly when they cannot read what they bound:
a peak RSS that cannot be read, or a handler-error counter that is missing
or renamed, raises instead of reading as 0."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import cast

import pytest

from kafka_gateway.prometheus import API_NAMES
from testkit import fuzz_run
from testkit.gateway import GatewayProcess


class _FakeGateway:
    """What the bounds read of a gateway: its output (the admin address) and its process."""

    def __init__(self, admin: str, process: subprocess.Popen[bytes] | None = None) -> None:
        self.admin = admin
        self.process = process

    def output(self) -> str:
        return f"admin http {self.admin}\n"


@pytest.fixture
def metrics_page() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server answering /metrics with the text in ``page[0]``."""
    page = [""]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page[0].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", page
    finally:
        server.shutdown()
        server.server_close()


def _counter(name: str, apis: list[str], value: int = 0) -> str:
    lines = [f"# HELP {name} Requests whose handler failed", f"# TYPE {name} counter"]
    lines += [f'{name}_total{{api="{api}"}} {value}.0' for api in apis]
    return "\n".join(lines) + "\n"


def test_handler_errors_sums_every_api(metrics_page):
    admin, page = metrics_page
    page[0] = _counter("kafka_gateway_request_errors", API_NAMES, 2)
    gateway = cast(GatewayProcess, _FakeGateway(admin))
    assert fuzz_run._handler_errors(gateway) == 2 * len(API_NAMES)


@pytest.mark.parametrize("page_text", [
    _counter("kafka_gateway_request_errors_by_api", API_NAMES),  # renamed, same prefix
    _counter("kafka_gateway_handler_errors", API_NAMES),  # renamed
    _counter("kafka_gateway_request_errors", API_NAMES[1:]),  # an API's series missing
    "",  # no metrics at all
])
def test_handler_errors_raise_when_the_counter_is_missing(metrics_page, page_text):
    admin, page = metrics_page
    page[0] = page_text
    gateway = cast(GatewayProcess, _FakeGateway(admin))
    with pytest.raises(RuntimeError, match="kafka_gateway_request_errors_total"):
        fuzz_run._handler_errors(gateway)


def test_peak_rss_raises_when_unreadable():
    # A zombie (exited, not yet waited for) has a status file without VmHWM.
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while "State:\tZ" not in Path(f"/proc/{process.pid}/status").read_text():
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.05)
        gateway = cast(GatewayProcess, _FakeGateway("", process))
        with pytest.raises(RuntimeError, match="VmHWM"):
            fuzz_run._peak_rss_mib(gateway)
    finally:
        process.wait(10)
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert fuzz_run._peak_rss_mib(cast(GatewayProcess, _FakeGateway("", running))) > 0
    finally:
        running.kill()
        running.wait(10)
