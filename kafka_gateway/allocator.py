"""The C allocator's two thresholds, fixed once when the gateway starts (glibc only).

Record batches and request frames of up to about 1 MiB are allocated and
freed at the produce rate. glibc's defaults give every such block back to the
kernel soon after it is freed:

- a block above the *mmap threshold* (128 KiB at start, then raised on the
  fly to the size of the last mmapped block freed) is a fresh ``mmap`` of its
  own, and ``munmap``-ed when freed;
- below it, a block comes from the heap, whose free top is cut back with
  ``brk`` whenever it exceeds the *trim threshold* (twice the mmap threshold).

Either way the kernel unmaps those pages, then maps and zeroes them again for
the next batch: a page fault per 4 KiB of every record produced. Measured
(``python -m bench --only produce``, 1 partition, same machine, alternating
runs): server CPU 1.1 against 1.5 to 1.6 s per GB produced, 650 to 690 against
480 to 550 MB/s. And freeing a large transaction's pending bytes at its commit
trimmed the heap in one go, on the event loop: 7 ms of a 100 MiB commit, whose
``commit_transaction()`` took 8 to 14 ms, and 3.4 to 3.6 ms with the thresholds
fixed (docs/performance.md, "The C allocator's thresholds").

So the mmap threshold is set to glibc's ceiling (32 MiB) and the trim
threshold to 64 MiB: freed blocks stay in the heap for the next batch, and at
most 64 MiB of free heap is kept before the top is given back. Setting either
turns off glibc's moving mmap threshold. An operator who sets glibc's malloc
tunables (``GLIBC_TUNABLES=glibc.malloc....``) keeps them: nothing is changed.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 64 << 20
# mallopt's parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_malloc() -> bool:
    """Fix glibc's mmap and trim thresholds for this process; False (and
    nothing changed) when the C library is not glibc, or the operator set
    glibc's malloc tunables."""
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        log.info("allocator: glibc's malloc tunables are set in GLIBC_TUNABLES; kept as they are")
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc's own symbol: absent elsewhere
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    if not (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        log.warning("allocator: glibc refused the malloc thresholds; running with its defaults")
        return False
    log.info("allocator: glibc malloc mmap threshold %d MiB, trim threshold %d MiB",
             MMAP_THRESHOLD >> 20, TRIM_THRESHOLD >> 20)
    return True
