"""Freeing segment files' space off the hot paths: closing unlinked files,
punching out aborted bytes.

Closing the last descriptor of an unlinked file is when the file system
frees its blocks: on a big file that takes milliseconds to seconds (ext4
with online ``discard`` trims every extent inside ``close``), in whichever
thread lets go of the file object last. ``PartitionFiles`` never closes a
file (a region handed out keeps its file object, ``log_reads``), so that
thread used to be whoever happened to be last: the writer thread, whose
last write still held the files of a deleted topic, and which then made
every produce wait behind the frees (measured: 5 ms per 300 MB file, the
first ~60 ms of produce after a topic's deletion acknowledged late; after
deleting 8 files of about 0.5 GB, half a second), or the event loop, when
a fetch's region of the file was the last holder.

``adopt`` gives the reaper a reference to each file object that is
unlinked; one daemon thread closes a file once that reference is the only
one left (CPython's reference count), so every other release is cheap.
``defer`` runs other such work on the same thread, in order: punching an
aborted transaction's byte ranges out of a file frees its blocks the same
way (22 ms for 100 MiB here), and was done by the writer thread.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from io import FileIO

log = logging.getLogger(__name__)

# How often files still held elsewhere are looked at again (seconds).
POLL_S = 0.05


class FileReaper:
    """Closes adopted files once nothing else holds them, on its own thread."""

    def __init__(self, poll_s: float = POLL_S) -> None:
        self._poll_s = poll_s
        self._cond = threading.Condition()
        self._files: list[FileIO] = []
        self._actions: list[Callable[[], None]] = []
        self._busy = 0  # taken by the thread, not done yet
        self._thread: threading.Thread | None = None
        self.closed = 0  # files this reaper closed

    def adopt(self, io: FileIO) -> None:
        """``io``'s file is unlinked: close it once nothing else holds it."""
        with self._cond:
            if any(held is io for held in self._files):
                return  # one reference of ours, or it would never be alone
            self._files.append(io)
            self._start()
            self._cond.notify()

    def defer(self, action: Callable[[], None]) -> None:
        """Run ``action`` (it frees space) on the reaper's thread, after the
        actions deferred before it."""
        with self._cond:
            self._actions.append(action)
            self._start()
            self._cond.notify()

    def pending(self) -> int:
        """Files adopted and still open (something else holds them), and
        actions not run yet."""
        with self._cond:
            return len(self._files) + len(self._actions) + self._busy

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="file-reaper",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._files and not self._actions:
                    self._cond.wait()
                actions, self._actions = self._actions, []
                lone = self._take_lone()
                self._busy = len(actions) + len(lone)
            self._work(actions, lone)
            del actions, lone
            with self._cond:
                self._busy = 0
                if self._files and not self._actions:  # held elsewhere: look again soon
                    self._cond.wait(self._poll_s)

    def _take_lone(self) -> list[FileIO]:
        """The adopted files nothing else holds now, taken out of the list."""
        files = self._files
        # Index, not a loop variable: the list's slot and the call's argument
        # are then the only references a lone file has.
        lone = {i for i in range(len(files)) if sys.getrefcount(files[i]) == 2}
        self._files = [io for i, io in enumerate(files) if i not in lone]
        return [files[i] for i in sorted(lone)]

    def _work(self, actions: list[Callable[[], None]], lone: list[FileIO]) -> None:
        for action in actions:
            try:
                action()
            except Exception:  # space not given back: the data is safe, log it
                log.exception("freeing space off the hot path failed")
        for io in lone:
            try:
                io.close()  # frees the blocks; releases the GIL meanwhile
            except OSError:  # the data is gone either way: log it, go on
                log.exception("closing a deleted segment file failed")
            self.closed += 1


REAPER = FileReaper()  # node-wide, as RECLAIMED (several engines in one test process)
