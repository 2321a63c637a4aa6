"""Where the gateway's busy CPU went, from a raw py-spy profile taken with native frames.

    python -m bench --only produce --partitions 8 --servers gateway \\
        --py-spy /tmp/produce.txt --py-spy-native
    python -m bench.pyspy_summary /tmp/produce.txt

Samples of threads waiting (a queue, a lock, epoll) are left out; every other sample is
put in the first category whose marker appears anywhere in its stack, so a category
includes what it calls. The shares are of the busy samples.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

# Frames that mean the thread was waiting, not working.
IDLE = ("_queue_SimpleQueue_get", "PyThread_acquire_lock_timed", "pthread_cond_timedwait",
        "pthread_cond_wait", "epoll_pwait", "epoll_wait", "sem_timedwait", "sem_wait")

# (label, marker): checked in this order against the whole stack.
CATEGORIES = (
    ("RocksDB CRC-32C (software, in the rocksdict wheel)", "rocksdb::crc32c"),
    ("RocksDB WAL and blob file writes (write syscalls)", "PosixWritableFile::Append"),
    ("RocksDB memtable insert (copy + skiplist)", "MemTable::Add"),
    ("RocksDB WriteBatch building (copies)", "RocksStore._apply"),
    ("RocksDB other (flush, compaction, reads)", "rocksdb::"),
    ("batch CRC-32C check (hardware)", "crc32c_crc32c"),
    ("offset stamping (one copy of each batch)", "stamp ("),
    ("socket reads (syscall)", ";read (libc"),
    ("socket writes (syscall)", "write (libc"),
    ("Produce handler (Python)", "apis/produce.py"),
    ("Fetch handler (Python)", "apis/fetch"),
    ("connection: frame buffers, response encoding (Python)", "connection.py"),
    ("group commit writer (Python)", "tablets/store.py"),
    # RocksStore and Ops, split out of store.py: counted with the writer, as before.
    ("group commit writer (Python)", "tablets/rocks_store.py"),
)


def summarize(path: Path) -> tuple[int, int, Counter[str], Counter[str]]:
    """(samples, busy samples, busy samples per category, busy samples per leaf frame)."""
    total = busy = 0
    categories: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        if any(marker in stack for marker in IDLE):
            continue
        busy += count
        label = next((label for label, marker in CATEGORIES if marker in stack), "other")
        categories[label] += count
        leaves[re.sub(r" \(.*", "", stack.rsplit(";", 1)[-1])] += count
    return total, busy, categories, leaves


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pyspy_summary", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", type=Path, help="py-spy raw output (--format raw)")
    parser.add_argument("--leaves", type=int, default=15, help="top leaf frames to list")
    args = parser.parse_args(argv)
    total, busy, categories, leaves = summarize(args.profile)
    if not busy:
        raise SystemExit(f"{args.profile}: no busy samples")
    print(f"{total} samples, {busy} busy ({busy / total:.0%})")
    for label, count in categories.most_common():
        print(f"{count / busy:6.1%}  {label}")
    print(f"\ntop {args.leaves} leaf frames (busy samples):")
    for frame, count in leaves.most_common(args.leaves):
        print(f"{count / busy:6.1%}  {frame}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
