"""Run a client function in a fresh child process and get its dict of numbers back.

Spawned (not forked) children: the parent holds librdkafka admin clients whose threads
must not be duplicated, and a fresh interpreter gives each run the same cold start.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

_CTX = mp.get_context("spawn")


class ChildError(RuntimeError):
    """The client function raised in the child; the message carries its traceback."""


def _child_main(conn: Connection, func: Callable[..., dict[str, float]],
                kwargs: dict[str, Any]) -> None:
    try:
        conn.send((True, func(**kwargs)))
    except BaseException:
        conn.send((False, traceback.format_exc()))
    finally:
        conn.close()


class Child:
    """One running client function; result() waits for its return value."""

    def __init__(self, func: Callable[..., dict[str, float]], **kwargs: Any) -> None:
        self._recv, send = _CTX.Pipe(duplex=False)
        self._process = _CTX.Process(target=_child_main, args=(send, func, kwargs),
                                     name=f"bench-{func.__name__}", daemon=True)
        self._process.start()
        send.close()  # the child holds the only writer: EOF if it dies without answering

    def result(self, timeout: float) -> dict[str, float]:
        try:
            if not self._recv.poll(timeout):
                raise TimeoutError(f"{self._process.name} gave no result in {timeout:.0f}s")
            ok, payload = self._recv.recv()
        except EOFError as error:
            raise ChildError(f"{self._process.name} died (exit code "
                             f"{self._process.exitcode})") from error
        finally:
            self._reap()
        if not ok:
            raise ChildError(payload)
        return payload

    def _reap(self) -> None:
        # librdkafka may take a moment to tear down; do not let a stuck child linger.
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._recv.close()


def new_event() -> Any:
    """An Event that can be handed to a spawned child (e.g. 'tail consumer is ready')."""
    return _CTX.Event()


def run_child(func: Callable[..., dict[str, float]], timeout: float,
              **kwargs: Any) -> dict[str, float]:
    return Child(func, **kwargs).result(timeout)
