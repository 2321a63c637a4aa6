"""Segment files: where a partition's record bytes are written, once.

Each partition has a directory ``<data-dir>/segments/<topic-id>-<partition>/``
of append-only files ``<file number>.log``. A produce appends the batch (a
plain one with its offsets stamped, a transactional one with base offset 0,
as it is pending) to the partition's *active* file; RocksDB keeps only where
it lies (``log_entry.file_entry``, in the ``L`` key, or the ``B`` key while
pending) and, per file, an ``F`` key: its size (the end of the last bytes an
index entry points at) and its *live* bytes (of batches some index entry
still names). Both change in the same WriteBatch as the entries they count.

Lifetime: a file is deleted when its live bytes reach 0 and it takes no more
writes (retention or DeleteRecords removed its batches, the cleaner replaced
them, their transaction aborted), once that change is durable. A new active
file is started when the active one passes ``max(segment.bytes,
FILE_MIN_BYTES)`` or ``max(segment.ms, FILE_MIN_MS)`` (and after every
restart). Aborted or
expired pending batches are reclaimed at once, in place: their byte range is
punched out of the file (``fallocate(PUNCH_HOLE)``: they were never indexed
in a log, so no reader can hold them).

Crash rules (``load``; the tablet checks the newest entries, ``check``):
bytes past a file's indexed size were never acknowledged and are cut; a file
with no ``F`` key was never indexed and is deleted.

The writer thread does the file writes (``Ops.write_file``) before the
RocksDB write that indexes them, and fdatasyncs them first when
``gateway.fsync=always`` (``SegmentFile.sync``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import shutil
import struct
from dataclasses import dataclass
from io import FileIO
from typing import TYPE_CHECKING

from crc32c import crc32c

from . import keys, log_entry
from .file_reaper import REAPER
from .rocks_store import Ops

if TYPE_CHECKING:
    from .rocks_store import RocksStore

log = logging.getLogger(__name__)

# Files are never shorter than this before they roll (a topic with a tiny
# segment.bytes would otherwise open thousands of files); the virtual
# segments (``segments``) still follow segment.bytes exactly for compaction.
FILE_MIN_BYTES = 1 << 20
FILE_MIN_MS = 60_000  # likewise for segment.ms (compacted test topics use 1 ms)
_FILE = struct.Struct(">qq")  # size, live bytes
_CRC = struct.Struct(">I")
_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
_SUFFIX = ".log"


@dataclass(slots=True)
class ReclaimStats:
    """Bytes given back to the file system (for metrics and the benchmark)."""

    files_deleted: int = 0
    bytes_deleted: int = 0  # sizes of the deleted files
    holes_punched: int = 0
    bytes_punched: int = 0  # aborted pending bytes, punched out


RECLAIMED = ReclaimStats()  # node-wide (several engines in one test process share it)


class SegmentFile:
    """One append-only file; the event loop hands out positions, the writer
    thread writes them (``Ops.write_file``)."""

    __slots__ = ("_dir_synced", "created_ms", "io", "live", "no", "path", "size")

    def __init__(self, no: int, path: str, io: FileIO, size: int, live: int,
                 created_ms: int, dir_synced: bool) -> None:
        self.no = no
        self.path = path
        self.io = io
        self.size = size
        self.live = live
        self.created_ms = created_ms
        self._dir_synced = dir_synced

    def fileno(self) -> int:
        return self.io.fileno()

    def sync(self) -> None:
        os.fdatasync(self.io.fileno())
        if not self._dir_synced:  # a new file: make its name durable too
            fd = os.open(os.path.dirname(self.path), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._dir_synced = True


class PartitionFiles:
    """A partition's segment files (a collaborator the tablet holds)."""

    def __init__(self, root: str, prefix: bytes, dirname: str) -> None:
        self.dir = os.path.join(root, dirname)
        self.prefix = prefix
        self.files: dict[int, SegmentFile] = {}
        self.active: SegmentFile | None = None
        self.writing: set[int] = set()  # files a compaction run still writes
        # Deleted files whose deletion is not durable yet: readers of an older
        # snapshot of the index may still name them.
        self._dying: dict[int, SegmentFile] = {}
        self.next_no = 0

    def _key(self, no: int) -> bytes:
        return keys.offset_key(keys.FILE, self.prefix, no)

    def _put(self, file: SegmentFile, ops: Ops) -> None:
        ops.put(self._key(file.no), _FILE.pack(file.size, file.live))

    # ------------------------------------------------------------ start-up
    def load(self, store: RocksStore) -> None:
        """Open the indexed files; cut what lies past their indexed size and
        delete the files no ``F`` key names (never indexed)."""
        start = keys.FILE + self.prefix
        known: dict[int, tuple[int, int]] = {}
        for key, value in store.scan(start, start + b"\xff" * 8):
            size, live = _FILE.unpack(value)
            known[keys.offset_of_key(key)] = (size, live)
        os.makedirs(self.dir, exist_ok=True)
        for name in os.listdir(self.dir):
            stem = name.removesuffix(_SUFFIX)
            if not (name.endswith(_SUFFIX) and stem.isdigit()) or int(stem) not in known:
                log.warning("%s: deleting %s, which no index entry names (written before "
                            "a crash, never acknowledged)", self.dir, name)
                os.unlink(os.path.join(self.dir, name))
        gone = Ops()
        for no, (size, live) in sorted(known.items()):
            path = self._path(no)
            if live <= 0:  # nothing in it is named any more (it was active at a stop)
                gone.delete(self._key(no))
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                continue
            io = FileIO(path, "r+" if os.path.exists(path) else "w+")
            actual = os.fstat(io.fileno()).st_size
            if actual > size:
                log.warning("%s: cutting %d bytes past the last indexed batch (written "
                            "before a crash, never acknowledged)", path, actual - size)
                os.ftruncate(io.fileno(), size)
            self.files[no] = SegmentFile(no, path, io, size, live, 0, True)
        self.next_no = max(known, default=-1) + 1
        if gone.deletes:
            store.write_now(gone)

    # -------------------------------------------------------------- writes
    def append(self, data: bytes | memoryview, ops: Ops, roll_bytes: int, roll_ms: int,
               now_ms: int) -> tuple[int, int]:
        """Queue ``data`` at the end of the active file (rolling it first if
        due); (file number, position)."""
        active = self.active
        if active is None or (active.size > 0 and (
                active.size + len(data) > max(roll_bytes, FILE_MIN_BYTES)
                or now_ms - active.created_ms > max(roll_ms, FILE_MIN_MS))):
            active = self._roll(ops, now_ms)
        return active.no, self.write_to(active, data, ops)

    def write_to(self, file: SegmentFile, data: bytes | memoryview, ops: Ops) -> int:
        """Queue ``data`` at the end of ``file``; its position."""
        position = file.size
        file.size += len(data)
        file.live += len(data)
        ops.write_file(file, position, data)
        self._put(file, ops)
        return position

    def new_file(self, ops: Ops, now_ms: int) -> SegmentFile:
        """A new file that only its maker writes (a compaction run's output)."""
        file = self._create(now_ms)
        self.writing.add(file.no)
        self._put(file, ops)
        return file

    def done_writing(self, file: SegmentFile, ops: Ops) -> None:
        self.writing.discard(file.no)
        if file.live <= 0:
            self._delete(file, ops)

    def _roll(self, ops: Ops, now_ms: int) -> SegmentFile:
        old = self.active
        self.active = self._create(now_ms)
        if old is not None and old.live <= 0:
            self._delete(old, ops)
        return self.active

    def _create(self, now_ms: int) -> SegmentFile:
        no = self.next_no
        self.next_no += 1
        path = self._path(no)
        os.makedirs(self.dir, exist_ok=True)
        file = SegmentFile(no, path, FileIO(path, "w+"), 0, 0, now_ms, False)
        self.files[no] = file
        return file

    def release(self, entry: bytes, ops: Ops) -> None:
        """The batch of ``entry`` is no longer indexed (retention, compaction,
        a cut): count it out of its file, delete the file once nothing in it
        is live."""
        no, _position, size, _shifted = log_entry.locate(entry)
        self.release_bytes(no, size, ops)

    def discard(self, entries: list[bytes], ops: Ops) -> None:
        """Pending batches that will never be indexed (their transaction
        aborted): count them out, and punch their byte ranges out of the
        files that stay, neighbouring ranges joined (a hole frees whole
        blocks only)."""
        ranges: dict[int, list[tuple[int, int]]] = {}
        for entry in entries:
            no, position, size, _shifted = log_entry.locate(entry)
            ranges.setdefault(no, []).append((position, position + size))
            self.release_bytes(no, size, ops)
        for no, spans in ranges.items():
            file = self.files.get(no)
            if file is None:
                continue  # deleted whole
            spans.sort()
            joined = [spans[0]]
            for start, end in spans[1:]:
                if start <= joined[-1][1]:
                    joined[-1] = (joined[-1][0], max(end, joined[-1][1]))
                else:
                    joined.append((start, end))
            # Once the abort is durable, on the reaper's thread: freeing the
            # blocks takes milliseconds (22 ms for 100 MiB here), which the
            # writer thread would make every produce wait for.
            ops.after_write(functools.partial(REAPER.defer,
                                              functools.partial(_punch_all, file, joined)))

    def release_bytes(self, no: int, nbytes: int, ops: Ops) -> SegmentFile | None:
        """``nbytes`` of file ``no`` are no longer live; the file if it stays."""
        file = self.files.get(no)
        if file is None:
            return None
        file.live -= nbytes
        if file.live <= 0 and file is not self.active and no not in self.writing:
            self._delete(file, ops)
            return None
        self._put(file, ops)
        return file

    def _delete(self, file: SegmentFile, ops: Ops) -> None:
        key = self._key(file.no)
        # A WriteBatch applies its deletes before its puts: drop this
        # change's earlier puts of the key, or one would bring it back.
        ops.puts = [(k, v) for k, v in ops.puts if k != key]
        ops.delete(key)
        self.files.pop(file.no, None)
        self._dying[file.no] = file

        def drop() -> None:  # on the writer thread, once the change is durable
            self._dying.pop(file.no, None)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(file.path)
            REAPER.adopt(file.io)  # its blocks are freed off this thread
            RECLAIMED.files_deleted += 1
            RECLAIMED.bytes_deleted += file.size

        ops.after_write(drop)

    def remove_all(self) -> None:
        """The partition is deleted (its keys already are): drop its files.
        Readers holding regions keep their descriptors; the reaper closes
        each once nothing holds it (a file still dying is its ``drop``'s)."""
        files = list(self.files.values())
        self.files.clear()
        self.active = None
        shutil.rmtree(self.dir, ignore_errors=True)
        for file in files:
            REAPER.adopt(file.io)

    # --------------------------------------------------------------- reads
    def open_file(self, no: int) -> FileIO | None:
        """File ``no``, open, for regions of it (``seam.FileRegion``), or None
        once its deletion is durable. Files are never closed here: a region
        handed out keeps its file object, so its bytes stay readable after
        the file is unlinked."""
        file = self.files.get(no) or self._dying.get(no)
        return None if file is None else file.io

    def read(self, entry: bytes) -> bytes:
        """The batch of ``entry``, read (as served: offsets patched)."""
        no, position, size, shifted = log_entry.locate(entry)
        file = self.files.get(no) or self._dying.get(no)
        data = b"" if file is None else os.pread(file.io.fileno(), size, position)
        if len(data) != size:
            raise log_entry.MissingBlob(
                f"log entry at offset {log_entry.base_offset(entry)}: {size - len(data)} of "
                f"its {size} bytes are missing from segment file {no}")
        if shifted:
            data = bytes(entry[:log_entry.PREFIX_SIZE]) + data[log_entry.PREFIX_SIZE:]
        return data

    def check(self, entry: bytes) -> str | None:
        """Why the bytes of ``entry`` are not the batch it indexes, or None."""
        try:
            data = self.read(entry)
        except log_entry.MissingBlob as exc:
            return str(exc)
        stored = _CRC.unpack_from(entry, log_entry.CRC_AT)[0]
        if _CRC.unpack_from(data, log_entry.CRC_AT)[0] != stored or \
                crc32c(memoryview(data)[log_entry.CRC_AT + 4:]) != stored:
            return (f"log entry at offset {log_entry.base_offset(entry)}: its bytes in "
                    f"segment file {log_entry.locate(entry)[0]} fail the batch CRC")
        return None

    def _path(self, no: int) -> str:
        return os.path.join(self.dir, f"{no:010d}{_SUFFIX}")

    @property
    def disk_bytes(self) -> int:
        """Bytes the partition's files take on disk (holes excluded)."""
        total = 0
        for file in list(self.files.values()):
            with contextlib.suppress(OSError):
                total += os.fstat(file.io.fileno()).st_blocks * 512
        return total


_libc: ctypes.CDLL | None = None


def _punch_all(file: SegmentFile, spans: list[tuple[int, int]]) -> None:
    for start, end in spans:
        _punch(file, start, end - start)


def _punch(file: SegmentFile, position: int, size: int) -> None:
    """Give the blocks of [position, position + size) back (the size stays)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fallocate = _libc.fallocate
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    if fallocate(file.io.fileno(), _PUNCH_HOLE, position, size) != 0:
        errno = ctypes.get_errno()
        log.warning("could not reclaim %d aborted bytes of %s: %s", size, file.path,
                    os.strerror(errno))
        return
    RECLAIMED.holes_punched += 1
    RECLAIMED.bytes_punched += size
